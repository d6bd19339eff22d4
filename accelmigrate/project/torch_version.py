"""Which torch a project targets, read without importing torch.

The migrated code must run on the torch the project trains with. Where the
project's own requirements confine it to a torch line (a pin, `torch==1.13.1`,
conda's `pytorch=1.12`; a range with an upper bound, `torch>=1.8,<2`,
`~=1.13`, poetry's `^1.13`), that line's lowest version is the target. They
are looked for beside the file and in the folders above it up to the
project's root (the first folder with a pyproject.toml, a setup.py or a
.git): requirements*.txt (and requirements/*.txt), pyproject.toml's
dependencies, setup.py's and setup.cfg's install_requires, environment.yml.
A bare minimum (`torch>=1.8`) confines nothing (a fresh install gets the
newest torch); a project that names no line targets the torch installed
beside accelmigrate (its metadata; none in a pre-commit hook's
environment: then nothing is assumed).

The engine leaves out a word whose code needs a newer torch (a codemod's
`needs_torch`), saying so (AM008), and the plain definitions written into a
file take the spelling its torch knows (codemods/script/plain_helpers.py).
A target older than the lowest torch any word writes for (a 2018 pin,
`torch==0.4.1`) is not one: the code is written for a current torch, with a
note (AM009) that the requirement must rise.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import os
import re
import tomllib
from pathlib import Path
from typing import Iterator, Optional

# The oldest torch any word writes code for: get_device() asks torch.backends.mps,
# which arrived in 1.12 (torch.autocast(device_type=...) in 1.10).
LOWEST_SUPPORTED = (1, 12)
_ROOT_MARKERS = ("pyproject.toml", "setup.py", ".git")
# `torch` as a requirement's name, then its version specifiers (not torchvision, not torch-geometric)
_REQUIREMENT = re.compile(r"^\s*(?:pytorch::)?(?:torch|pytorch)(?![\w.-])\s*(?:\[[^\]]*\])?\s*([^;#@]*)", re.IGNORECASE)
# the operators of a lower bound (pip's, conda's `=`, poetry's `^` and `~`), not `<=` or `!=`
_LOWER_BOUND = re.compile(r"(?<![<>!=~])(===|==|>=|~=|>|\^|~|=)\s*v?(\d+)(?:\.(\d+))?")


@dataclasses.dataclass(frozen=True)
class TorchTarget:
    version: tuple[int, int]
    where: str  # what says so, for messages: "requirements.txt: `torch>=1.8`"

    def key(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    @property
    def supported(self) -> bool:
        """A torch the words can write for. An older pin (`torch==0.4.1`, which
        no current Python installs) is not the torch the project trains with
        today: the code is written for a current torch, and a note says so."""
        return self.version >= LOWEST_SUPPORTED


def targeted_torch(path: str) -> Optional[TorchTarget]:
    """The torch the project of the file at PATH trains with, or None when
    neither its requirements nor an installed torch say."""
    if not path or path.startswith("<"):  # stdin, an editor's unsaved buffer
        return installed_torch()
    return _declared(str(Path(path).resolve().parent)) or installed_torch()


@functools.lru_cache(maxsize=64)
def _declared(folder: str) -> Optional[TorchTarget]:
    from accelmigrate.project.modules import PARENT_LEVELS  # the folders above a script its imports are followed into

    here = Path(folder)
    for directory in [here, *here.parents][: PARENT_LEVELS + 1]:
        for file in _declaration_files(directory):
            found = _confinement_in(file, directory)
            if found is not None:
                return found
        if any((directory / marker).exists() for marker in _ROOT_MARKERS):
            break
    return None


def _declaration_files(directory: Path) -> list[Path]:
    """The files that may require torch, the main ones first (requirements.txt
    before a requirements-dev.txt)."""
    names = ["pyproject.toml", "setup.cfg", "setup.py", "requirements.txt", "environment.yml", "environment.yaml"]
    files = [directory / name for name in names]
    try:
        files += sorted(directory.glob("requirements?*.txt")) + sorted(directory.glob("requirements/*.txt"))
    except OSError:
        pass
    return [file for file in files if file.is_file()]


def _confinement_in(file: Path, root: Path) -> Optional[TorchTarget]:
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for requirement in _torch_requirements(file.name, text):
        version = confined_to(requirement)
        if version is not None:
            return TorchTarget(version, f"{file.relative_to(root) if file.is_relative_to(root) else file}: `{requirement.strip()}`")
    return None


def _torch_requirements(name: str, text: str) -> Iterator[str]:
    """The lines or strings of a declaration file that require torch."""
    if name == "pyproject.toml":
        yield from _pyproject_requirements(text)
    elif name == "setup.py":
        yield from _setup_py_requirements(text)
    else:  # requirements*.txt, setup.cfg, environment.yml: one requirement a line
        for line in text.splitlines():
            line = line.strip().lstrip("-").strip()
            if _REQUIREMENT.match(line):
                yield line


def _pyproject_requirements(text: str) -> Iterator[str]:
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError):
        return
    project = data.get("project") if isinstance(data.get("project"), dict) else {}
    listed = list(project.get("dependencies") or [])
    for extra in (project.get("optional-dependencies") or {}).values():
        listed += list(extra or [])
    yield from (item for item in listed if isinstance(item, str) and _REQUIREMENT.match(item))
    poetry = data.get("tool", {}).get("poetry", {}) if isinstance(data.get("tool"), dict) else {}
    spec = (poetry.get("dependencies") or {}).get("torch") if isinstance(poetry, dict) else None
    spec = spec.get("version") if isinstance(spec, dict) else spec
    if isinstance(spec, str):
        yield f"torch {spec}"


def _setup_py_requirements(text: str) -> Iterator[str]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _REQUIREMENT.match(node.value):
            yield node.value


def confined_to(requirement: str) -> Optional[tuple[int, int]]:
    """The lowest (major, minor) of the torch line a requirement confines the
    project to: its highest lower bound where it pins a version or bounds it
    from above (`torch==1.13.1`, `torch>=1.8,<2` -> (1, 8)); None for a bare
    minimum (`torch>=1.8`), no version (`torch`) or a URL."""
    match = _REQUIREMENT.match(requirement)
    if match is None:
        return None
    specifiers = match.group(1)
    bounds = [(int(major), int(minor or 0)) for _, major, minor in _LOWER_BOUND.findall(specifiers)]
    operators = {operator for operator, _, _ in _LOWER_BOUND.findall(specifiers)}
    confined = "<" in specifiers or bool(operators - {">=", ">"})
    return max(bounds) if bounds and confined else None


@functools.lru_cache(maxsize=1)
def installed_torch() -> Optional[TorchTarget]:
    version = _installed_version()
    found = re.match(r"v?(\d+)(?:\.(\d+))?", version) if version else None
    if found is None:
        return None
    return TorchTarget((int(found.group(1)), int(found.group(2) or 0)), f"the installed torch {version}")


def _installed_version() -> Optional[str]:
    """The installed torch's version, from the name of its `torch-<version>.dist-info`
    folder beside the package (found without importing it); importlib.metadata
    (20 ms to import, which a check would otherwise not pay) where that folder
    is not there."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin:
        folder = os.path.dirname(os.path.dirname(spec.origin))
        try:
            names = os.listdir(folder)
        except OSError:
            names = []
        for name in names:
            if name.startswith("torch-") and name.endswith(".dist-info"):
                return name[len("torch-") : -len(".dist-info")]
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
