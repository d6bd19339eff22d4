"""Finding, reading and writing source files without losing a byte.

A file is decoded with the encoding Python itself would use (PEP 263 coding
line, UTF-8 BOM), newlines untouched, and written back the same way,
atomically: a temporary file in the same folder, then a rename, made only
if the file is still what was read (a save made meanwhile is never lost).

Only regular files are read (a FIFO or a device named `*.py` would block or
never end). A symbolic link is followed: the file it names is rewritten and
the link stays. A file is refused rather than rewritten when a rename would
change more than its text: read-only, other hard links (a rename gives the
path a new inode and the other names keep the old text), or an owner that
cannot be kept.

The temporary file's name carries the writer's process id; a later `apply`
removes those whose writer is gone (killed in the middle of a write).
"""

from __future__ import annotations

import dataclasses
import ast
import codecs
import contextlib
import fnmatch
import hashlib
import io
import os
import re
import stat
import tempfile
import time
import tokenize
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

from accelmigrate.files.git_ignores import GitIgnores

# Folders that never hold the user's own training code.
SKIPPED_FOLDERS = frozenset(
    {
        ".git", ".hg", ".svn", ".venv", "venv", "env", ".env", ".tox", ".nox", "__pycache__",
        ".mypy_cache", ".pytest_cache", ".ruff_cache", ".accelmigrate_cache", "build", "dist", "site-packages",
        "node_modules", ".eggs", ".ipynb_checkpoints",
    }
)


class InputError(Exception):
    """A path that cannot be processed; the message is one line for the user."""


@dataclasses.dataclass(frozen=True)
class FileStamp:
    """What a file was when it was read: a rewrite checks it still is."""

    size: int
    mtime_ns: int
    digest: str  # sha256 of the bytes read

    @classmethod
    def of(cls, status: os.stat_result, data: bytes) -> "FileStamp":
        return cls(status.st_size, status.st_mtime_ns, hashlib.sha256(data).hexdigest())


@dataclasses.dataclass(frozen=True)
class SourceText:
    text: str
    encoding: str  # "utf-8-sig" when the file starts with a BOM
    read_as: Optional[FileStamp] = dataclasses.field(default=None, compare=False, repr=False)  # None: not read from a file


def is_virtualenv(folder: Path) -> bool:
    return os.path.isfile(folder / "pyvenv.cfg")  # False, not an error, in a folder that cannot be entered


def _unlisted(error: OSError, on_error: Optional[Callable[[str, str], None]]) -> None:
    """os.walk's report of a folder it could not list (it skips the folder)."""
    folder = str(Path(error.filename))  # as the files are named: `./a` is `a`
    message = f"{folder}: cannot list folder: {error.strerror or error}"
    if on_error is None:
        raise InputError(message)
    on_error(folder, message)


def excluded(path: Path, patterns: Sequence[str]) -> bool:
    text = path.as_posix()
    return any(fnmatch.fnmatch(text, p) or fnmatch.fnmatch(path.name, p) or fnmatch.fnmatch(text, f"*/{p}") for p in patterns)


# What a folder is searched for: Python scripts and Jupyter notebooks.
SOURCE_SUFFIXES = (".py", ".ipynb")


def iter_python_files(
    paths: Iterable[str],
    exclude: Sequence[str] = (),
    on_error: Optional[Callable[[str, str], None]] = None,
    on_skip: Optional[Callable[[str], None]] = None,
    respect_gitignore: bool = True,
) -> Iterator[Path]:
    """The files named, and every `*.py` and `*.ipynb` below the folders named (sorted),
    skipping version-control, virtual-environment, build and cache folders.
    A path that does not exist is yielded as is: reading it reports the error.
    A folder that cannot be listed is given to `on_error(folder, message)`,
    the message one line (`PATH: cannot list folder: REASON`), and the walk
    goes on; without `on_error`, it is an InputError. A link found in a folder
    that leads outside it is not followed (as black does): rewriting it would
    change a file of another project; `on_skip(message)` is told. What git
    ignores is not walked (accelmigrate/files/git_ignores.py) unless
    `respect_gitignore` is False."""
    for raw in paths:
        path = Path(raw)
        if not os.path.isdir(path):  # Path.is_dir raises where a parent cannot be entered
            if not excluded(path, exclude):
                yield path
            continue
        root = path.resolve()
        ignores = GitIgnores(path) if respect_gitignore else None
        for folder, subfolders, files in os.walk(path, onerror=lambda error: _unlisted(error, on_error)):
            here = Path(folder)
            if ignores is not None and here != path:
                ignores.enter(here)
            subfolders[:] = sorted(
                d for d in subfolders
                if d not in SKIPPED_FOLDERS and not d.endswith(".egg-info")
                and not is_virtualenv(here / d) and not excluded(here / d, exclude)
                and not (ignores is not None and ignores.ignores(here / d, is_folder=True))
            )
            for name in sorted(files):
                file = here / name
                if not name.endswith(SOURCE_SUFFIXES) or excluded(file, exclude):
                    continue
                if ignores is not None and ignores.ignores(file, is_folder=False):
                    continue
                if os.path.islink(file) and not file.resolve().is_relative_to(root):
                    if on_skip is not None:
                        on_skip(f"{file}: a link to {file.resolve()}, outside {path}; skipped")
                    continue
                yield file


def read_source(path: Path) -> SourceText:
    try:
        data, status = _read_regular_file(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder") from None
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror or error}") from None
    return dataclasses.replace(decode_source(path, data), read_as=FileStamp.of(status, data))


def _read_regular_file(path: Path) -> tuple[bytes, os.stat_result]:
    """The bytes of `path` (links followed) and the status of the file they
    were read from, refusing anything but a regular file before reading from
    it: opening a FIFO waits for a writer, and a device such as /dev/zero
    never ends."""
    status = os.stat(path)
    if stat.S_ISDIR(status.st_mode):
        raise IsADirectoryError(21, "Is a directory")
    _ensure_regular(path, status)
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(descriptor, "rb") as handle:
        status = os.fstat(descriptor)
        _ensure_regular(path, status)  # the path may have been replaced since
        return handle.read(), status


def _ensure_regular(path: Path, status: os.stat_result) -> None:
    if not stat.S_ISREG(status.st_mode):
        raise InputError(f"{path}: not a regular file ({_file_kind(status.st_mode)}); skipped")


def _file_kind(mode: int) -> str:
    kinds = [(stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")]
    return next((name for test, name in kinds if test(mode)), "not a file")


def decode_source(path: Path, data: bytes) -> SourceText:
    if b"\x00" in data:
        raise InputError(f"{path}: binary file (contains NUL bytes), not Python source")
    encoding = _declared_encoding(path, data)
    if encoding == "utf-8" and data.startswith(codecs.BOM_UTF8):
        encoding = "utf-8-sig"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise InputError(
            f"{path}:{line}: not valid {encoding.upper()} (byte 0x{data[error.start]:02x} at offset {error.start}); "
            "declare the file's encoding with a '# -*- coding: ... -*-' line or re-save it as UTF-8"
        ) from None
    except (UnicodeError, LookupError) as error:
        raise InputError(f"{path}: cannot be decoded as {encoding} (its coding line): {one_line(str(error))}") from None
    return SourceText(text, encoding)


def _declared_encoding(path: Path, data: bytes) -> str:
    """The encoding CPython would read `data` with, refusing what CPython
    refuses: an unknown codec, a codec that does not decode to text (rot13,
    hex, zlib...), a coding line that contradicts a UTF-8 BOM."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as error:
        if "invalid or missing encoding declaration" in str(error):
            return "utf-8"  # undecodable first lines: decoding says where
        if data.startswith(codecs.BOM_UTF8):
            raise InputError(f"{path}:1: a UTF-8 BOM and a coding line naming another encoding; Python refuses this file") from None
        raise InputError(f"{path}: {error}") from None
    if encoding != "utf-8":
        _ensure_python_decodes(path, data)
    return encoding


def _ensure_python_decodes(path: Path, data: bytes) -> None:
    """A declared encoding is accepted only if CPython's own reader accepts it
    (which codecs it takes is its decision, not a list kept here); the rarity
    of coding lines makes the extra parse cheap."""
    try:
        ast.parse(data)
    except SyntaxError as error:
        if not error.lineno:  # no line: the decoding failed, not the grammar
            raise InputError(f"{path}: Python cannot decode this file with its coding line: {one_line(error.msg)}") from None
    except Exception:
        pass  # whatever else is wrong is reported on the decoded text


def one_line(message: str) -> str:
    """A message kept on one line of output (a line break in it escaped)."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def write_atomically(path: Path, source: SourceText, replacing: Optional[FileStamp] = None) -> None:
    """Replace the file at `path` (through a symbolic link: the file it names)
    by `source` so that no reader ever sees a torn file, keeping the file's
    permissions and owner; refuse what a rename cannot keep (see above), and,
    given the stamp of what was read (`replacing`), a file that changed since
    (an editor's save must not be lost)."""
    data = source.text.encode(source.encoding)
    target = Path(os.path.realpath(path))
    status = os.stat(target)
    _ensure_rewritable(path, target, status)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=TEMPORARY_SUFFIX, dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        _keep_owner(path, temporary, status)
        os.chmod(temporary, stat.S_IMODE(status.st_mode))  # after chown, which may clear set-id bits
        with _still_as_read(path, target, replacing):
            os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


# How long a rewrite waits for another run rewriting the same file (a
# rename takes microseconds; past this, some other program holds the lock).
LOCK_WAIT_S = 10.0


@contextlib.contextmanager
def _still_as_read(path: Path, target: Path, stamp: Optional[FileStamp]) -> Iterator[None]:
    """Held around the rename: the file at `target` is still the one read
    (size, modification time and content), else the write is refused. An
    advisory lock on that file keeps two runs from both passing the check
    before either renames: the later one sees the other's file, and refuses."""
    if stamp is None:
        yield
        return
    changed = InputError(f"{path}: changed while it was being migrated; not written")
    try:
        descriptor = os.open(target, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise changed from None
    try:
        _lock(path, descriptor)
        status, current = os.fstat(descriptor), os.stat(target)
        with os.fdopen(descriptor, "rb", closefd=False) as handle:
            now = FileStamp.of(status, handle.read())
        if (status.st_dev, status.st_ino) != (current.st_dev, current.st_ino) or now != stamp:
            raise changed
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _lock(path: Path, descriptor: int) -> None:
    try:
        import fcntl
    except ImportError:
        return  # no advisory locks here (Windows): the check alone
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise InputError(f"{path}: not written: another process holds a lock on the file") from None
            time.sleep(0.01)
        except OSError:
            return  # a file system without locks: the check alone


def _ensure_rewritable(path: Path, target: Path, status: os.stat_result) -> None:
    _ensure_regular(path, status)
    if not status.st_mode & stat.S_IWUSR or not os.access(target, os.W_OK):
        raise InputError(f"{path}: not written: the file is read-only (mode {stat.S_IMODE(status.st_mode):o}); make it writable to migrate it")
    if status.st_nlink > 1:
        raise InputError(
            f"{path}: not written: the file has {status.st_nlink} hard links, and an atomic rewrite (a rename) would leave "
            "the other names with the old text; remove the other links, or migrate a copy"
        )


def _keep_owner(path: Path, temporary: str, status: os.stat_result) -> None:
    written = os.stat(temporary)
    if not hasattr(os, "chown") or (written.st_uid, written.st_gid) == (status.st_uid, status.st_gid):
        return
    try:
        os.chown(temporary, status.st_uid, status.st_gid)
    except PermissionError:
        raise InputError(
            f"{path}: not written: the rewritten file could not keep its owner ({status.st_uid}:{status.st_gid}); "
            "run as that user"
        ) from None


# -- temporary files left by a writer that was killed -------------------------------

TEMPORARY_SUFFIX = ".accelmigrate"
# `.NAME.PID.RANDOM.accelmigrate`; older versions wrote `.NAME.RANDOM.accelmigrate`.
_TEMPORARY = re.compile(r"^\.(?P<name>.+?)(?:\.(?P<pid>\d+))?\.[a-z0-9_]{8}" + re.escape(TEMPORARY_SUFFIX) + "$")
# A write takes milliseconds: a temporary file this old has no writer left,
# even one on another machine sharing the folder (whose process ids mean
# nothing here).
DEAD_WRITER_GRACE_S = 60.0
ABANDONED_AFTER_S = 3600.0


def remove_stale_temporaries(folders: Iterable[Path]) -> list[Path]:
    """Remove the temporary files in `folders` that no writer will rename any
    more: its process is gone and it is over a minute old, or it is over an
    hour old. Returns the files removed."""
    removed = []
    for folder in folders:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            match = _TEMPORARY.match(name)
            if match and _is_stale(folder / name, match.group("pid")):
                try:
                    (folder / name).unlink()
                    removed.append(folder / name)
                except OSError:
                    pass  # gone already, or not ours to remove
    return removed


def _is_stale(file: Path, pid: str | None) -> bool:
    try:
        status = os.lstat(file)
    except OSError:
        return False
    if not stat.S_ISREG(status.st_mode):
        return False
    age = time.time() - status.st_mtime
    if age > ABANDONED_AFTER_S:
        return True
    return pid is not None and age > DEAD_WRITER_GRACE_S and not _process_alive(int(pid))


def _process_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process id we can ask about
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return not _is_zombie(pid)  # it exists, as another user's process
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """A killed process whose parent has not reaped it yet still answers
    os.kill, but will never write again (known where /proc tells)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as status:
            line = status.read()
    except OSError:
        return False
    return line[line.rfind(")") + 2 :][:1] in ("Z", "X")  # the state follows "(command) "
