"""A cache of results, as ruff and mypy keep one: an unchanged file is
answered without parsing it again.

An entry holds what migrating one file gave (the migrated text, or "unchanged";
the findings; or the error that refused it). Its key is a hash of the file's
path and content (its decoded text and encoding: all that the result depends
on) within a namespace, a hash of everything else that could change the
result: the tool's version (the package version, the versions of Python,
LibCST and black, and a hash of the tool's own source files, so that an edit
of a codemod or of the engine invalidates every entry), the codemods with
their options, the mode (check or apply) and the black settings.

Layout: `<project root>/.accelmigrate_cache/<version>-<namespace>/<key>.json`,
with a `.gitignore` holding `*` (the folder ignores itself, as ruff's does)
and a CACHEDIR.TAG (backup tools skip it). `ACCELMIGRATE_CACHE_DIR` puts the
folder elsewhere. Entries are written atomically (a temporary file, then a
rename), so worker processes can write side by side and a reader never sees
half an entry; an entry that cannot be read or does not make sense is a miss.
The cache is an aid, never a source of errors: when it cannot be written, the
run goes on without it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Mapping, Optional, Sequence

from accelmigrate import __version__
from accelmigrate.codemods import Finding
from accelmigrate.sources import SourceText

CACHE_FOLDER_NAME = ".accelmigrate_cache"
CACHE_DIR_VARIABLE = "ACCELMIGRATE_CACHE_DIR"
GITIGNORE = "# Created by accelmigrate: this folder is a cache.\n*\n"
CACHEDIR_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# A cache folder created by accelmigrate (https://bford.info/cachedir/).\n"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What migrating one file's content gave."""

    migrated: Optional[str]  # None: unchanged (or refused, with `error`)
    findings: list[Finding]
    error: Optional[str] = None


def cache_folder(project_root: Path) -> Path:
    """Where the cache lives: `ACCELMIGRATE_CACHE_DIR`, else `.accelmigrate_cache`
    at the project root."""
    override = os.environ.get(CACHE_DIR_VARIABLE)
    return Path(override) if override else project_root / CACHE_FOLDER_NAME


@dataclasses.dataclass(frozen=True)
class ResultCache:
    """The entries of one namespace (tool, codemods, options, mode). Plain and
    picklable: worker processes receive it with their files."""

    folder: Path

    @classmethod
    def open(cls, root: Path, settings: Mapping[str, object]) -> Optional["ResultCache"]:
        """The namespace of `settings` under `root`, its folders created; None
        when they cannot be (a read-only project: the run goes on uncached)."""
        described = json.dumps({"tool": tool_version(), **settings}, sort_keys=True, default=str)
        namespace = f"{__version__}-{hashlib.sha256(described.encode()).hexdigest()[:20]}"
        try:
            root.mkdir(parents=True, exist_ok=True)
            for name, text in ((".gitignore", GITIGNORE), ("CACHEDIR.TAG", CACHEDIR_TAG)):
                if not (root / name).exists():
                    _write_atomically(root / name, text)
            (root / namespace).mkdir(exist_ok=True)
        except OSError:
            return None
        return cls(root / namespace)

    def key(self, path: str, source: SourceText) -> str:
        """The path as given (it appears in messages) and as an absolute path
        (the same relative path in two folders is two files), and the content."""
        digest = hashlib.sha256()
        for part in (path, os.path.abspath(path), source.encoding):
            digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
        digest.update(source.text.encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    def get(self, key: str) -> Optional[Outcome]:
        try:
            return _outcome_of(json.loads((self.folder / f"{key}.json").read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, KeyError):  # missing, unreadable, corrupt: a miss
            return None

    def put(self, key: str, outcome: Outcome) -> None:
        entry = {
            "migrated": outcome.migrated,
            "findings": [dataclasses.astuple(f) for f in outcome.findings],
            "error": outcome.error,
        }
        try:
            _write_atomically(self.folder / f"{key}.json", json.dumps(entry))
        except OSError:
            pass  # a full disk or a folder removed meanwhile: this result is simply not kept


def _outcome_of(entry: Mapping) -> Outcome:
    """An entry read back, its types checked (anything else raises)."""
    migrated, error = entry["migrated"], entry["error"]
    findings = [_finding_of(item) for item in entry["findings"]]
    if not (migrated is None or isinstance(migrated, str)) or not (error is None or isinstance(error, str)):
        raise TypeError("not a cache entry")
    return Outcome(migrated, findings, error)


def _finding_of(item: Sequence) -> Finding:
    line, column, code, message, fixed, word = item
    types = (int, int, str, str, bool, str)
    if not all(isinstance(value, kind) for value, kind in zip((line, column, code, message, fixed, word), types)):
        raise TypeError("not a finding")
    return Finding(line, column, code, message, fixed, word)


def _write_atomically(path: Path, text: str) -> None:
    """A temporary file in the same folder, then a rename: a reader sees the
    whole entry or none, whichever process wrote it."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


@functools.lru_cache(maxsize=None)
def tool_version() -> str:
    """The package version, the versions of what shapes the output, and a
    hash of the tool's own source files."""
    versions = [__version__, sys.version, _version_of("libcst"), _version_of("black")]
    return " ".join(versions) + " " + source_digest(tool_source_files())


def tool_source_files() -> list[Path]:
    """The engine's and the codemods' source files (and the rest of the
    package's: an edit anywhere there invalidates the cache)."""
    import accelmigrate
    import accelmigrate.codemods

    folders = {Path(accelmigrate.__file__).parent, Path(accelmigrate.codemods.__file__).parent}
    return sorted({file.resolve() for folder in folders for file in folder.rglob("*.py")})


def source_digest(files: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


def _version_of(distribution: str) -> str:
    try:
        return f"{distribution} {metadata.version(distribution)}"
    except metadata.PackageNotFoundError:
        return f"{distribution} ?"
