"""`[tool.accelmigrate]` in the nearest pyproject.toml.

    [tool.accelmigrate]
    to = ["modernize", "workers", "item", "empty-cache"]   # or "workers,item"
    exclude = ["legacy/*"]
    select = ["AM1", "AM2"]                  # only these codes (prefixes, as ruff's)
    ignore = ["AM104"]                       # never these (the longer prefix wins)
    respect-gitignore = false                # also walk what git ignores (default: true)

    [tool.accelmigrate.per-file-ignores]
    "tests/*" = ["AM1"]                      # glob (relative to this file, or a file name) -> codes

    [tool.accelmigrate.options.workers]      # per-codemod options
    max_workers = "8"

Command-line flags win over the file. A key or a codemod word that means
nothing here is an error naming the file and the key, with the close match.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import os
from pathlib import Path
from typing import Collection, Mapping, Optional, Sequence

from accelmigrate.engine.formatting import configured_targets, project_line_length, project_python

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]


class ConfigError(ValueError):
    pass


@dataclasses.dataclass
class Config:
    path: Optional[Path] = None
    to: Optional[list[str]] = None
    exclude: list[str] = dataclasses.field(default_factory=list)
    options: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    black: dict = dataclasses.field(default_factory=dict)  # [tool.black], for formatting output (its target-version: else ruff's, else requires-python)
    line_length: Optional[int] = None  # black's `line-length`, else ruff's: where inserted code is wrapped
    select: Optional[list[str]] = None  # code prefixes to report (None: every code)
    ignore: list[str] = dataclasses.field(default_factory=list)  # code prefixes never reported
    per_file_ignores: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # glob -> code prefixes
    respect_gitignore: bool = True  # a folder's walk leaves out what git ignores (accelmigrate/files/git_ignores.py)
    runtime: bool = False  # migrated code imports the runtime's helpers instead of carrying plain ones (engine/plain_code.py)

    def codes(self) -> "CodeSelection":
        """The select/ignore settings, in a plain form worker processes can take."""
        return CodeSelection(
            None if self.select is None else tuple(self.select),
            tuple(self.ignore),
            tuple((glob, tuple(codes)) for glob, codes in self.per_file_ignores.items()),
            str(self.path.parent) if self.path is not None else os.getcwd(),
        )


@dataclasses.dataclass(frozen=True)
class CodeSelection:
    """Which finding codes count, by prefix as ruff's `select` and `ignore`:
    of the prefixes that match a code, the longest decides (an ignore wins a
    tie); `per_file_ignores` adds ignores for the files its globs match
    (relative to `root`, the configuration's folder, or the file's name)."""

    select: Optional[tuple[str, ...]] = None
    ignore: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    root: str = "."

    def ignored_for(self, path: str) -> tuple[str, ...]:
        ignored = list(self.ignore)
        if self.per_file_ignores:
            name = os.path.basename(path)
            try:
                relative = Path(os.path.relpath(os.path.abspath(path), self.root)).as_posix()
            except ValueError:  # another drive
                relative = Path(path).as_posix()
            for glob, codes in self.per_file_ignores:
                if fnmatch.fnmatchcase(relative, glob) or fnmatch.fnmatchcase(name, glob):
                    ignored.extend(codes)
        return tuple(ignored)

    def selects(self, code: str, path: str) -> bool:
        return self.decides(code, self.ignored_for(path))

    def decides(self, code: str, ignored: Sequence[str]) -> bool:
        code = code.upper()
        chosen = max((len(p) for p in (self.select if self.select is not None else ("",)) if code.startswith(p.upper())), default=-1)
        refused = max((len(p) for p in ignored if code.startswith(p.upper())), default=-1)
        return chosen >= 0 and chosen > refused

    def silenced(self, path: str, known: Collection[str]) -> frozenset:
        """The known codes that do not count in `path` (the codemods leave them alone)."""
        if self.select is None and not self.ignore and not self.per_file_ignores:
            return frozenset()
        ignored = self.ignored_for(path)
        return frozenset(code for code in known if not self.decides(code, ignored))

    def prefixes(self) -> list[tuple[str, str]]:
        """Every code prefix given, with the key it was given under."""
        found = [(p, "select") for p in self.select or ()] + [(p, "ignore") for p in self.ignore]
        return found + [(p, f"per-file-ignores {glob!r}") for glob, codes in self.per_file_ignores for p in codes]


def find_pyproject(start: Path) -> Optional[Path]:
    start = start.resolve()
    # os.path's tests, not Path's: they answer False, not PermissionError, below a folder that cannot be entered
    for folder in [start, *start.parents] if os.path.isdir(start) else start.parents:
        candidate = folder / "pyproject.toml"
        if os.path.isfile(candidate):
            return candidate
    return None


def common_start(paths: Sequence[str]) -> Path:
    """Where to look for the configuration: the first path's folder, else here."""
    if paths:
        first = Path(paths[0])
        return first if os.path.isdir(first) else (first.parent if str(first.parent) else Path("."))
    return Path(".")


def load_config(start: Path) -> Config:
    """The configuration in the nearest pyproject.toml; a value of the wrong
    type is a ConfigError naming the key and the type it must have."""
    pyproject = find_pyproject(start)
    if pyproject is None:
        return Config()
    return read_config(pyproject)


def read_config(pyproject: Path) -> Config:
    """The `[tool.accelmigrate]` of this file (pyproject.toml, or the file
    given with --config), checked as `load_config` says."""
    if not os.path.isfile(pyproject):
        raise ConfigError(f"{pyproject}: no such configuration file")
    pyproject = pyproject.resolve()
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject}: cannot read the configuration: {error}") from None
    except RecursionError:  # tomllib parses nested arrays and tables by recursion
        raise ConfigError(f"{pyproject}: cannot read the configuration: nested too deeply") from None
    check = _Checker(pyproject)
    tool = check.table(data.get("tool", {}), "'tool'")
    section = check.table(tool.get("accelmigrate", {}), "[tool] 'accelmigrate'")
    check.known_keys(section, SECTION_KEYS, "[tool.accelmigrate]")
    to = section.get("to")
    if to is not None:
        to = check.words(check.strings(to, "[tool.accelmigrate] 'to'"))
    exclude = check.strings(section.get("exclude", []), "[tool.accelmigrate] 'exclude'")
    options = {
        str(word): {str(k): check.scalar(v, f"[tool.accelmigrate.options.{word}] {k!r}") for k, v in table.items()}
        for word, table in check.table(section.get("options", {}), "[tool.accelmigrate] 'options'").items()
        if check.table(table, f"[tool.accelmigrate.options] {word!r}") is not None
    }
    check.option_names(options)
    select = section.get("select")
    if select is not None:
        select = check.strings(select, "[tool.accelmigrate] 'select'")
        if not select:  # a check that selects nothing would pass having checked nothing
            raise ConfigError(f"{pyproject}: [tool.accelmigrate] 'select' names no code; give codes or prefixes, or leave 'select' out for every code")
    ignore = check.strings(section.get("ignore", []), "[tool.accelmigrate] 'ignore'")
    per_file = {
        str(glob): check.strings(codes, f"[tool.accelmigrate.per-file-ignores] {glob!r}")
        for glob, codes in check.table(section.get("per-file-ignores", {}), "[tool.accelmigrate] 'per-file-ignores'").items()
    }
    respect_gitignore = check.boolean(section.get("respect-gitignore", True), "[tool.accelmigrate] 'respect-gitignore'")
    runtime = check.boolean(section.get("runtime", False), "[tool.accelmigrate] 'runtime'")
    black = check.black(tool.get("black", {}))
    python = project_python(data)
    if python and not configured_targets(black):
        black["target-version"] = python  # ruff's target or requires-python: what inserted code may use
    return Config(
        pyproject, to, exclude, options, black, project_line_length(tool), select, ignore, per_file,
        respect_gitignore, runtime,
    )


SECTION_KEYS = ("to", "exclude", "options", "select", "ignore", "per-file-ignores", "respect-gitignore", "runtime")


class _ReadKeys(dict):
    """Options that remember which keys were read."""

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self.read.add(key)
        return super().__contains__(key)


def option_names_read(cls, options: Mapping[str, str]) -> set[str]:
    """The option names a codemod understands among `options`: those its
    `check_options` reads (it reads every option the codemod takes)."""
    recorded = _ReadKeys(options)
    try:
        cls.check_options(recorded)
    except ValueError:
        pass  # a bad value: reported when the codemods are chosen
    return recorded.read


def close_match(name: str, known: Collection[str]) -> str:
    """` (did you mean 'x'?)` when a known name is close to `name`."""
    matches = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


# The [tool.black] settings that formatting reads, with the type each must have.
_BLACK_SETTINGS = {
    "line-length": int, "line_length": int,
    "skip-string-normalization": bool, "skip-magic-trailing-comma": bool,
}
_TYPE_NAMES = {dict: "a table", list: "an array", str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


class _Checker:
    def __init__(self, pyproject: Path) -> None:
        self.pyproject = pyproject

    def fail(self, key: str, expected: str, value: object) -> ConfigError:
        found = _TYPE_NAMES.get(type(value), type(value).__name__)
        return ConfigError(f"{self.pyproject}: {key} must be {expected}, not {found} ({value!r})")

    def unknown(self, key: str, where: str, known: Collection[str]) -> ConfigError:
        return ConfigError(f"{self.pyproject}: unknown key {key!r} in {where}{close_match(key, known)}; known: {', '.join(known)}")

    def known_keys(self, table: Mapping, known: Collection[str], where: str) -> None:
        for key in table:
            if key not in known:
                raise self.unknown(str(key), where, known)

    def words(self, spec: list[str]) -> list[str]:
        """The `to` words, each naming a codemod."""
        from accelmigrate.codemods import UnknownCodemod, infos, parse_words

        all_codemods = infos

        try:
            words = parse_words(spec)
        except UnknownCodemod as error:
            raise ConfigError(f"{self.pyproject}: [tool.accelmigrate] 'to': {error}") from None
        if not words:
            raise ConfigError(f"{self.pyproject}: [tool.accelmigrate] 'to' names no codemod")
        for word in words:
            if word not in all_codemods():
                raise ConfigError(
                    f"{self.pyproject}: [tool.accelmigrate] 'to': unknown codemod {word!r}"
                    f"{close_match(word, all_codemods())}; see `accelmigrate list`"
                )
        return spec

    def option_names(self, options: Mapping[str, Mapping[str, str]]) -> None:
        """Each [tool.accelmigrate.options.WORD] names a codemod, and each key an option it takes."""
        from accelmigrate.codemods import infos

        registry = infos()
        for word, table in options.items():
            if word not in registry:
                raise self.unknown(word, "[tool.accelmigrate.options]", registry)
            taken = option_names_read(registry[word], table)
            for key in table:
                if key != "value" and key not in taken:
                    known = sorted(option_names_read(registry[word], {}) - {"value"})
                    raise ConfigError(
                        f"{self.pyproject}: unknown key {key!r} in [tool.accelmigrate.options.{word}]"
                        f"{close_match(key, known)}; {word} takes "
                        + (", ".join(known) if known else "no options")
                    )

    def table(self, value: object, key: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, "a table", value)
        return value

    def strings(self, value: object, key: str) -> list[str]:
        if isinstance(value, str):
            return [value]
        if not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            raise self.fail(key, "a string or an array of strings", value)
        return list(value)

    def boolean(self, value: object, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, "a boolean", value)
        return value

    def scalar(self, value: object, key: str) -> str:
        if not isinstance(value, (str, int, float, bool)):
            raise self.fail(key, "a string, a number or a boolean", value)
        return str(value).lower() if isinstance(value, bool) else str(value)

    def black(self, value: object) -> dict:
        settings = self.table(value, "[tool] 'black'")
        for key, expected in _BLACK_SETTINGS.items():
            if key in settings and not (type(settings[key]) is expected):
                raise self.fail(f"[tool.black] {key!r}", _TYPE_NAMES[expected], settings[key])
        return dict(settings)
