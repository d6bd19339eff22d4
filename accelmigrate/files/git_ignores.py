"""What git ignores, for a folder walk: a git-ignored file is nobody's source.

As ruff and black do, a folder named on the command line is walked without
the files and folders that the `.gitignore` files above and inside it (up to
the repository's root, or the walked folder outside a repository) and
`.git/info/exclude` ignore. A deeper file's rule wins over a shallower one,
a later line over an earlier one, and `!pattern` takes a path back, as git
reads them (pathspec's GitIgnoreSpec). A file named on the command line is
processed whatever git ignores; `respect-gitignore = false` in
`[tool.accelmigrate]` turns the rule off.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

IGNORE_FILE = ".gitignore"


def _repository_root(folder: Path) -> Optional[Path]:
    for candidate in (folder, *folder.parents):
        if os.path.exists(candidate / ".git"):
            return candidate
    return None


def _read_rules(file: Path):
    """The file's rules, or None where it is missing or unreadable."""
    try:
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    from pathspec import GitIgnoreSpec  # imported only where a project has rules

    return GitIgnoreSpec.from_lines(lines)


class GitIgnores:
    """The rules that decide a walk of `folder`: those of the folders above
    it are read now, each folder's own as the walk enters it (`enter`)."""

    def __init__(self, folder: Path) -> None:
        folder = folder.absolute()
        top = _repository_root(folder)
        self._rules: dict[Path, object] = {}  # folder -> its rules
        if top is not None:
            self._add(top, top / ".git" / "info" / "exclude")
            for above in reversed(folder.relative_to(top).parents):  # from the root down, the walked folder left out
                self._add(top / above, top / above / IGNORE_FILE)
        self.enter(folder)

    def _add(self, folder: Path, file: Path) -> None:
        if os.path.isfile(file):
            rules = _read_rules(file)
            if rules is not None:
                previous = self._rules.get(folder)
                self._rules[folder] = rules if previous is None else previous + rules

    def enter(self, folder: Path) -> None:
        self._add(folder.absolute(), folder.absolute() / IGNORE_FILE)

    def ignores(self, path: Path, *, is_folder: bool) -> bool:
        if not self._rules:
            return False
        path = path.absolute()
        decided = None
        for folder in reversed(path.parents):  # the shallowest rules first: deeper ones win
            rules = self._rules.get(folder)
            if rules is not None:
                relative = path.relative_to(folder).as_posix() + ("/" if is_folder else "")
                include = rules.check_file(relative).include
                if include is not None:
                    decided = include
        return bool(decided)
