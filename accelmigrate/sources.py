"""Finding, reading and writing source files without losing a byte.

A file is decoded with the encoding Python itself would use (PEP 263 coding
line, UTF-8 BOM), newlines untouched, and written back the same way,
atomically: a temporary file in the same folder, then a rename.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import os
import shutil
import tempfile
import tokenize
from pathlib import Path
from typing import Iterable, Iterator, Sequence

# Folders that never hold the user's own training code.
SKIPPED_FOLDERS = frozenset(
    {
        ".git", ".hg", ".svn", ".venv", "venv", "env", ".env", ".tox", ".nox", "__pycache__",
        ".mypy_cache", ".pytest_cache", ".ruff_cache", "build", "dist", "site-packages",
        "node_modules", ".eggs", ".ipynb_checkpoints",
    }
)


class InputError(Exception):
    """A path that cannot be processed; the message is one line for the user."""


@dataclasses.dataclass(frozen=True)
class SourceText:
    text: str
    encoding: str  # "utf-8-sig" when the file starts with a BOM


def is_virtualenv(folder: Path) -> bool:
    return (folder / "pyvenv.cfg").is_file()


def _excluded(path: Path, patterns: Sequence[str]) -> bool:
    text = path.as_posix()
    return any(fnmatch.fnmatch(text, p) or fnmatch.fnmatch(path.name, p) or fnmatch.fnmatch(text, f"*/{p}") for p in patterns)


def iter_python_files(paths: Iterable[str], exclude: Sequence[str] = ()) -> Iterator[Path]:
    """The files named, and every `*.py` below the folders named (sorted),
    skipping version-control, virtual-environment, build and cache folders.
    A path that does not exist is yielded as is: reading it reports the error."""
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            if not _excluded(path, exclude):
                yield path
            continue
        for folder, subfolders, files in os.walk(path):
            here = Path(folder)
            subfolders[:] = sorted(
                d for d in subfolders
                if d not in SKIPPED_FOLDERS and not d.endswith(".egg-info")
                and not is_virtualenv(here / d) and not _excluded(here / d, exclude)
            )
            for name in sorted(files):
                file = here / name
                if name.endswith(".py") and not _excluded(file, exclude):
                    yield file


def read_source(path: Path) -> SourceText:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder") from None
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror or error}") from None
    return decode_source(path, data)


def decode_source(path: Path, data: bytes) -> SourceText:
    if b"\x00" in data:
        raise InputError(f"{path}: binary file (contains NUL bytes), not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as error:
        if "unknown encoding" in str(error):
            raise InputError(f"{path}: {error}") from None
        encoding = "utf-8"  # undecodable first lines: decoding below says where
    if encoding == "utf-8" and data.startswith(b"\xef\xbb\xbf"):
        encoding = "utf-8-sig"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise InputError(
            f"{path}:{line}: not valid {encoding.upper()} (byte 0x{data[error.start]:02x} at offset {error.start}); "
            "declare the file's encoding with a '# -*- coding: ... -*-' line or re-save it as UTF-8"
        ) from None
    return SourceText(text, encoding)


def write_atomically(path: Path, source: SourceText) -> None:
    """Replace `path` by `source` so that no reader ever sees a torn file,
    keeping the file's permissions."""
    data = source.text.encode(source.encoding)
    folder = path.parent
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".accelmigrate", dir=folder)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        shutil.copymode(path, temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
