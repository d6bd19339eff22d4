"""A cache of results, as ruff and mypy keep one: an unchanged file is
answered without parsing it again.

An entry holds what migrating one file gave (the migrated text, or "unchanged";
the findings; or the error that refused it). Its key is a hash of the file's
path and content (its decoded text and encoding), of the first-party layout
that import sorting reads (apply only), within a namespace, a hash of
everything else that could change the result: the tool's version (the package
version, the versions of Python, LibCST and black, and a hash of the tool's
own source files, so that an edit of a codemod or of the engine invalidates
every entry), the codemods with their options, the mode (check or apply) and
the black settings.

Layout: `<project root>/.accelmigrate_cache/<version>-<namespace>/<key>.json`,
with a `.gitignore` holding `*` (the folder ignores itself, as ruff's does)
and a CACHEDIR.TAG (backup tools skip it). `ACCELMIGRATE_CACHE_DIR` puts the
folder elsewhere.

Trust: the folder sits in the project tree, where anyone who can put a file
in the repository can put an entry. So no entry is believed unless it carries
an HMAC-SHA256, over its namespace, key and bytes, made with a secret of the
user's own that lives outside the tree (`$XDG_CACHE_HOME/accelmigrate/secret`,
else `~/.cache/accelmigrate/secret`; created once, mode 0600): an entry
written by anyone else, or edited, or damaged, is a miss and the file is
migrated afresh. The MAC is checked on the raw bytes before they are parsed;
an entry is opened without following a link, never blocking, only if it is a
regular file, and read up to a bound set by the file's size. Without the
secret (no home folder, a secret others can read) the run goes on uncached.
A cache folder or namespace folder that is a symbolic link is not used (a
link planted in a repository must not make the tool write outside it).

Entries are written atomically (a temporary file, then a rename), so worker
processes can write side by side and a reader never sees half an entry. The
cache is an aid, never a source of errors: when it cannot be written, the
run goes on without it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import json
import os
import secrets
import stat
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Optional, Sequence

from accelmigrate import __version__
from accelmigrate.codemods import Finding
from accelmigrate.files.sources import SourceText

CACHE_FOLDER_NAME = ".accelmigrate_cache"
CACHE_DIR_VARIABLE = "ACCELMIGRATE_CACHE_DIR"
GITIGNORE = "# Created by accelmigrate: this folder is a cache.\n*\n"
CACHEDIR_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# A cache folder created by accelmigrate (https://bford.info/cachedir/).\n"
SECRET_BYTES = 32
SIGNATURE_BYTES = 64  # the hex digest of an HMAC-SHA256
# An entry holds the migrated text (JSON escapes a character in at most 12
# bytes) and the findings: anything longer is not one of ours.
ENTRY_BYTES_PER_CHARACTER = 12
ENTRY_MARGIN_BYTES = 2**20
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What migrating one file's content gave."""

    migrated: Optional[str]  # None: unchanged (or refused, with `error`)
    findings: list[Finding]
    error: Optional[str] = None


def cache_folder(project_root: Path) -> Path:
    """Where the cache lives: `ACCELMIGRATE_CACHE_DIR` (the user's own choice,
    links resolved), else `.accelmigrate_cache` at the project root."""
    override = os.environ.get(CACHE_DIR_VARIABLE)
    return Path(os.path.realpath(override)) if override else project_root / CACHE_FOLDER_NAME


@dataclasses.dataclass(frozen=True)
class ResultCache:
    """The entries of one namespace (tool, codemods, options, mode), and the
    user's secret that signs them. Plain and picklable: worker processes
    receive it with their files."""

    folder: Path
    secret: bytes = dataclasses.field(repr=False)

    @classmethod
    def open(cls, root: Path, settings: Mapping[str, object]) -> Optional["ResultCache"]:
        """The namespace of `settings` under `root`, its folders created; None
        when they cannot be (a read-only project), when one is a symbolic
        link, or without the user's secret: the run goes on uncached."""
        if _in_project(secret_path(), root):
            return None  # before the secret is made: none is ever written into the work tree
        secret = user_secret(secret_path())
        if secret is None:
            return None
        described = json.dumps({"tool": tool_version(), **settings}, sort_keys=True, default=str)
        namespace = f"{__version__}-{hashlib.sha256(described.encode()).hexdigest()[:20]}"
        try:
            root.mkdir(parents=True, exist_ok=True)
            if not _real_folder(root):
                return None
            for name, text in ((".gitignore", GITIGNORE), ("CACHEDIR.TAG", CACHEDIR_TAG)):
                if not os.path.lexists(root / name):
                    _write_atomically(root / name, text.encode())
            (root / namespace).mkdir(exist_ok=True)
            if not _real_folder(root / namespace):
                return None
        except OSError:
            return None
        return cls(root / namespace, secret)

    def key(self, path: str, source: SourceText, layout: str = "") -> str:
        """The path as given (it appears in messages) and as an absolute path
        (the same relative path in two folders is two files), the content,
        and the first-party `layout` that the result depends on."""
        digest = hashlib.sha256()
        for part in (path, os.path.abspath(path), source.encoding, layout):
            digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
        digest.update(source.text.encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    def get(self, key: str, source: SourceText) -> Optional[Outcome]:
        """The entry of `key` if this user's secret signed it; anything else
        (missing, not a regular file, too long, unsigned, damaged) is a miss."""
        data = _read_entry(self.folder / f"{key}.json", _entry_limit(source))
        if data is None:
            return None
        signature, _, payload = data.partition(b"\n")
        if not hmac.compare_digest(signature, self._sign(key, payload)):
            return None
        try:
            return _outcome_of(json.loads(payload))
        except (ValueError, TypeError, KeyError, RecursionError):  # not an entry this version wrote
            return None

    def put(self, key: str, outcome: Outcome, source: SourceText) -> None:
        entry = {
            "migrated": outcome.migrated,
            "findings": [dataclasses.astuple(f) for f in outcome.findings],
            "error": outcome.error,
        }
        payload = json.dumps(entry).encode("utf-8", "surrogatepass")
        if SIGNATURE_BYTES + 1 + len(payload) > _entry_limit(source):
            return  # would not be read back
        try:
            _write_atomically(self.folder / f"{key}.json", self._sign(key, payload) + b"\n" + payload)
        except OSError:
            pass  # a full disk or a folder removed meanwhile: this result is simply not kept

    def _sign(self, key: str, payload: bytes) -> bytes:
        message = f"{self.folder.name}\0{key}\0".encode() + payload
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest().encode()


def _entry_limit(source: SourceText) -> int:
    return ENTRY_BYTES_PER_CHARACTER * len(source.text) + ENTRY_MARGIN_BYTES


def _in_project(secret: Optional[Path], root: Path) -> bool:
    """Whether the secret lies in the project that holds the cache folder at
    `root` (it could then have come with the repository)."""
    if os.environ.get(CACHE_DIR_VARIABLE) or secret is None:
        return False  # a cache folder the user chose: no project to be inside
    project = os.path.realpath(root.parent)
    return os.path.commonpath([project, os.path.realpath(secret)]) == project


def _real_folder(path: Path) -> bool:
    """A folder, not a link to one."""
    return stat.S_ISDIR(os.lstat(path).st_mode)


def _read_entry(path: Path, limit: int) -> Optional[bytes]:
    """The bytes of a regular file at `path` (not through a link), at most
    `limit` of them; None for anything else. Opening never blocks (a FIFO)."""
    try:
        descriptor = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(descriptor, limit + 1 - size)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        return None
    except OSError:
        return None
    finally:
        os.close(descriptor)


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


def _write_atomically(path: Path, data: bytes) -> None:
    """A temporary file in the same folder, then a rename: a reader sees the
    whole entry or none, whichever process wrote it (a link or FIFO planted
    at `path` is replaced, never written through)."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


# -- the user's secret ----------------------------------------------------------------------


def secret_path() -> Optional[Path]:
    """`$XDG_CACHE_HOME/accelmigrate/secret`, else `~/.cache/accelmigrate/secret`
    (None without a home folder)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG rule: a relative value is ignored
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):
            return None
    return Path(base) / "accelmigrate" / "secret"


@functools.lru_cache(maxsize=None)
def user_secret(path: Optional[Path]) -> Optional[bytes]:
    """The secret at `path`, created (atomically, mode 0600) when there is
    none; None when it cannot be had, or when it is not the user's own
    (another owner, readable by others, a link, another size)."""
    if path is None:
        return None
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".secret.")  # mode 0600
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(secrets.token_bytes(SECRET_BYTES))
            os.link(temporary, path)  # never replaces: a secret another process made first is kept
        except FileExistsError:
            pass
        finally:
            os.unlink(temporary)
        return _read_secret(path)
    except OSError:
        return None


def _read_secret(path: Path) -> Optional[bytes]:
    descriptor = os.open(path, _READ_FLAGS)
    try:
        status = os.fstat(descriptor)
        owner = os.getuid() if hasattr(os, "getuid") else status.st_uid
        if not stat.S_ISREG(status.st_mode) or status.st_uid != owner or status.st_mode & 0o077:
            return None
        secret = os.read(descriptor, SECRET_BYTES + 1)
    finally:
        os.close(descriptor)
    return secret if len(secret) == SECRET_BYTES else None


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
    from importlib import metadata  # its import costs a fifth of a clean file's check: only when the cache is used

    try:
        return f"{distribution} {metadata.version(distribution)}"
    except metadata.PackageNotFoundError:
        return f"{distribution} ?"
