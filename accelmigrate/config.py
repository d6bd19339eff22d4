"""`[tool.accelmigrate]` in the nearest pyproject.toml.

    [tool.accelmigrate]
    to = ["modernize", "workers", "item", "empty-cache"]   # or "workers,item"
    exclude = ["legacy/*"]

    [tool.accelmigrate.options.workers]      # per-codemod options
    max_workers = "8"

Command-line flags win over the file. A key or a codemod word that means
nothing here is an error naming the file and the key, with the close match.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path
from typing import Collection, Mapping, Optional, Sequence

from accelmigrate.formatting import project_line_length

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
    black: dict = dataclasses.field(default_factory=dict)  # [tool.black], for formatting output
    line_length: Optional[int] = None  # black's `line-length`, else ruff's: where inserted code is wrapped


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
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject}: cannot read the configuration: {error}") from None
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
    return Config(pyproject, to, exclude, options, check.black(tool.get("black", {})), project_line_length(tool))


SECTION_KEYS = ("to", "exclude", "options")


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
        from accelmigrate.codemods import UnknownCodemod, all_codemods, parse_words

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
        from accelmigrate.codemods import all_codemods

        registry = all_codemods()
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
