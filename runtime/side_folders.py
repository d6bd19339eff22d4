"""Each run of `accelmigrate verify` in a folder of its own.

`mirror(source, copy)` makes `copy` a stand-in for the folder `source`: its
folders are real folders and its files real copies, so what a run writes
(a checkpoint, a log, a run folder) lands in the copy and never in the
project, and the other run cannot read it. What would make the copy too
large is linked instead (a file over `COPIED_FILE_BYTES`, files past
`COPIED_BYTES` in all, folders past `MIRRORED_ENTRIES`, version-control and
virtual-environment folders), and so are the entries beside `source` (a
script that reads `../data` still finds it). `__pycache__` is left out.

A link made here points at the same path under `source` (that is how it is
told from the project's own links, which are kept as they are). Inside the
run, `Guard.install()` turns such a link into a real folder or a copy before a
write, a removal or a rename reaches through it, for what the script does
through Python's own file calls (`open`, `os.open`, `os.mkdir`,
`os.remove`, `os.rename`, ...); `unfold(path)` does it for other writers.
Standard library only: no torch.
"""

from __future__ import annotations

import builtins
import collections
import io
import os
import shutil
from typing import Callable, Iterable

# The guard's own calls, never guarded.
_mkdir, _unlink, _symlink, _listdir, _readlink = os.mkdir, os.unlink, os.symlink, os.listdir, os.readlink

COPIED_FILE_BYTES = 16 * 1024 * 1024
COPIED_BYTES = 256 * 1024 * 1024
MIRRORED_ENTRIES = 20_000
LINKED_FOLDERS = frozenset({".git", ".hg", ".svn", ".venv", "venv", ".tox", ".nox", "node_modules"})
LEFT_OUT = frozenset({"__pycache__", ".accelmigrate_cache", ".mypy_cache", ".pytest_cache", ".ruff_cache"})


def mirror(source: str, copy: str, keep_real: Iterable[str] = ()) -> None:
    """Mirror the folder `source` at `copy` (which must not exist); the
    entries beside `source` are linked beside `copy`. The folders named in
    `keep_real` (under `source`) and the folders above them stay real
    folders whatever the budget."""
    source, copy = os.path.abspath(source), os.path.abspath(copy)
    real = {source} | {os.path.abspath(p) for kept in keep_real for p in _with_parents(kept, source)}
    budget = {"entries": MIRRORED_ENTRIES, "bytes": COPIED_BYTES}
    os.makedirs(os.path.dirname(copy), exist_ok=True)
    _link_beside(source, copy)
    queue = collections.deque([(source, copy)])
    os.mkdir(copy)
    while queue:
        folder, target = queue.popleft()
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue  # unreadable: the run finds it as unreadable as the original would
        for name in names:
            if name in LEFT_OUT:
                continue
            path, there = os.path.join(folder, name), os.path.join(target, name)
            budget["entries"] -= 1
            if os.path.islink(path):
                os.symlink(_link_target(path, source, copy), there)
            elif os.path.isdir(path):
                if path in real or (budget["entries"] > 0 and name not in LINKED_FOLDERS and not _is_virtualenv(path)):
                    os.mkdir(there)
                    queue.append((path, there))
                else:
                    os.symlink(path, there)
            else:
                _copy_or_link(path, there, budget)


def _link_target(link: str, source: str, copy: str) -> str:
    """Where the project's own link points, for the copy: into the copy when
    it points inside `source`, else the same place (made absolute)."""
    target = os.path.realpath(link)
    if target == source or target.startswith(source + os.sep):
        return os.path.join(copy, os.path.relpath(target, source))
    return target


def _with_parents(path: str, top: str) -> list[str]:
    path = os.path.abspath(path)
    found = []
    while path.startswith(top + os.sep):
        found.append(path)
        path = os.path.dirname(path)
    return found


def _is_virtualenv(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "pyvenv.cfg"))


def _copy_or_link(path: str, there: str, budget: dict) -> None:
    try:
        size = os.stat(path).st_size
    except OSError:
        return
    if os.path.isfile(path) and size <= COPIED_FILE_BYTES and size <= budget["bytes"]:
        try:
            shutil.copy2(path, there)
            budget["bytes"] -= size
            return
        except OSError:
            pass  # unreadable: linked, so the run meets the same error
    os.symlink(path, there)


def _link_beside(source: str, copy: str) -> None:
    parent = os.path.dirname(source)
    if parent == source or parent == os.path.dirname(parent):
        return  # `source` sits at the file system's top: nothing beside it worth linking
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if name != os.path.basename(source) and name not in LEFT_OUT:
            os.symlink(os.path.join(parent, name), os.path.join(os.path.dirname(copy), name))


# --- inside the run -------------------------------------------------------------


class Guard:
    """Links that `mirror` made under `copy` (standing for `source`) made
    real on the way to a path about to be written."""

    def __init__(self, source: str, copy: str) -> None:
        self.source, self.copy = os.path.abspath(source), os.path.abspath(copy)

    def _made_here(self, path: str, relative: str) -> bool:
        return os.path.islink(path) and _readlink(path) == os.path.join(self.source, relative)

    def unfold(self, path, keep_content: bool = True) -> None:
        """Make real every link of ours on the way to `path` and `path`
        itself: a folder becomes a folder of links to its entries, a file a
        copy (or nothing, when `keep_content` is false: it is replaced)."""
        if isinstance(path, int):
            return
        path = os.path.abspath(os.fsdecode(os.fspath(path)))
        relative = os.path.relpath(path, self.copy)
        if relative == os.curdir or relative.startswith(os.pardir):
            return
        current, walked = self.copy, []
        for part in relative.split(os.sep):
            current, walked = os.path.join(current, part), [*walked, part]
            if not self._made_here(current, os.path.join(*walked)):
                continue
            original = _readlink(current)
            _unlink(current)
            if os.path.isdir(original):
                _mkdir(current)
                for name in _listdir(original):
                    _symlink(os.path.join(original, name), os.path.join(current, name))
            elif keep_content or current != path:
                shutil.copy2(original, current)

    def install(self) -> None:
        """Unfold before Python's own file calls write, remove or rename."""
        _wrap(builtins, "open", self._before_open)
        _wrap(io, "open", self._before_open)
        _wrap(os, "open", self._before_os_open)
        for name in ("mkdir", "remove", "unlink", "rmdir"):
            _wrap(os, name, lambda path, *a, **k: self._parent_of(path))
        for name in ("rename", "replace", "link", "symlink"):
            _wrap(os, name, lambda first, second, *a, **k: (self._parent_of(first), self._parent_of(second)))

    def _parent_of(self, path) -> None:
        if not isinstance(path, int):
            self.unfold(os.path.dirname(os.path.abspath(os.fsdecode(os.fspath(path)))))

    def _before_open(self, file, mode="r", *args, **kwargs) -> None:
        if isinstance(mode, str) and any(flag in mode for flag in "wax+"):
            self.unfold(file, keep_content="w" not in mode)

    def _before_os_open(self, path, flags, *args, **kwargs) -> None:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC):
            self.unfold(path, keep_content=not flags & os.O_TRUNC)


def _wrap(owner, name: str, before: Callable) -> None:
    original = getattr(owner, name)

    def guarded(*args, **kwargs):
        if kwargs.get("dir_fd") is None and kwargs.get("src_dir_fd") is None:
            try:
                before(*args, **kwargs)
            except (OSError, TypeError, ValueError):
                pass  # the call itself reports what is wrong with its arguments
        return original(*args, **kwargs)

    guarded.__wrapped__ = original
    setattr(owner, name, guarded)
