"""`[tool.accelmigrate]` in the nearest pyproject.toml.

    [tool.accelmigrate]
    to = ["workers", "item", "empty-cache"]   # or "workers,item"
    exclude = ["legacy/*"]

    [tool.accelmigrate.options.workers]      # per-codemod options
    max_workers = "8"

Command-line flags win over the file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence

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


def find_pyproject(start: Path) -> Optional[Path]:
    start = start.resolve()
    for folder in [start, *start.parents] if start.is_dir() else start.parents:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def common_start(paths: Sequence[str]) -> Path:
    """Where to look for the configuration: the first path's folder, else here."""
    if paths:
        first = Path(paths[0])
        return first if first.is_dir() else (first.parent if str(first.parent) else Path("."))
    return Path(".")


def load_config(start: Path) -> Config:
    pyproject = find_pyproject(start)
    if pyproject is None:
        return Config()
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject}: cannot read the configuration: {error}") from None
    tool = data.get("tool", {})
    section = tool.get("accelmigrate", {})
    to = section.get("to")
    if isinstance(to, str):
        to = [to]
    if to is not None and not (isinstance(to, list) and all(isinstance(w, str) for w in to)):
        raise ConfigError(f"{pyproject}: [tool.accelmigrate] 'to' must be a string or a list of strings")
    exclude = section.get("exclude", [])
    if isinstance(exclude, str):
        exclude = [exclude]
    options = {
        word: {str(k): str(v) for k, v in table.items()}
        for word, table in section.get("options", {}).items()
        if isinstance(table, dict)
    }
    return Config(pyproject, to, list(exclude), options, dict(tool.get("black", {})))
