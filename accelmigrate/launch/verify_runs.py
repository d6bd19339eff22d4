"""The two runs of `accelmigrate verify`, each in a folder of its own.

A workspace is one temporary folder (outside the project) holding, for each
side, a mirror of the project (`accelmigrate.runtime.side_folders`) with the
script under its own name and in its own encoding (the original's text, or
the migrated one), and the folder its records are written to. Each run
starts in the mirror of the current folder, so what it writes (checkpoints,
logs) lands in its own copy: the other run never reads it, and the project is
left as it was. The workspace is removed when verify ends, however it ends:
SIGTERM and SIGHUP are raised as `Stopped` and Ctrl-C as KeyboardInterrupt,
and each run's whole process group (torchrun's ranks, DataLoader workers) is
stopped on the way out.

The mirrored folder is the current folder when the script lies below it (the
script may read paths relative to it), else the script's own folder, where a
script outside the current folder then runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Optional, Sequence

from accelmigrate.files.sources import SourceText, write_atomically
from accelmigrate.runtime.side_folders import mirror

RECORDER = "accelmigrate.runtime.verifying"
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
GRACE_S = 5.0  # a stopped run's time to end before it is killed


class RunFailed(Exception):
    """A run that failed; the message names the script and shows its output's end."""


class Stopped(BaseException):
    """verify was sent SIGTERM or SIGHUP."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Stopped` (so that every `finally` cleans up)."""

    def stop(signum, frame):
        raise Stopped(signum)

    previous = {}
    try:
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, stop)
    except ValueError:
        pass  # not the main thread: signals stay as they are
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Cleaning up is not cut short by a second signal (it comes after)."""
    held = {*STOP_SIGNALS, signal.SIGINT}
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


class Workspace:
    """The temporary folder of one verify; `run` runs one side in it."""

    def __init__(self, script: Path, modules: Iterable[Path] = ()) -> None:
        """`modules`: files of the project (resolved) that the migrated side
        replaces too; the mirror is rooted where it holds them all."""
        self.script = script.resolve()
        here = Path.cwd().resolve()
        self.root = here if here in self.script.parents else self.script.parent
        for module in modules:
            while self.root not in module.parents:
                self.root = self.root.parent
        self.cwd = here if here == self.root or self.root in here.parents else self.script.parent
        self.folders = [str(module.parent) for module in modules]  # kept real in the mirror: a module is written there
        self.top: Optional[str] = None

    def __enter__(self) -> "Workspace":
        self.top = tempfile.mkdtemp(prefix="accelmigrate-verify-")
        return self

    def __exit__(self, *exc) -> None:
        with _signals_held():
            shutil.rmtree(self.top, ignore_errors=True)

    def run(
        self, side: str, source: SourceText, script_args: Sequence[str], env: dict[str, str], processes: int = 1,
        modules: Optional[Mapping[Path, SourceText]] = None,
    ) -> list[dict]:
        """Run `source` as the script, in this side's mirror, with `modules`
        (resolved path -> text) in place of the project's; one record per rank."""
        side_parent = os.path.join(self.top, side)
        copy_root = os.path.join(side_parent, self.root.name or "root")
        mirror(str(self.root), copy_root, keep_real=[str(self.script.parent), str(self.cwd), *self.folders])
        script = os.path.join(copy_root, os.path.relpath(self.script, self.root))
        _write_script(Path(script), source)
        for module, text in (modules or {}).items():
            _write_script(Path(copy_root, os.path.relpath(module, self.root)), text)
        records = os.path.join(self.top, f"{side}-records")
        os.mkdir(records)
        env = {
            **env,
            "ACCELMIGRATE_VERIFY_OUT": records,
            "ACCELMIGRATE_VERIFY_MIRROR": os.pathsep.join([str(self.root.parent), side_parent]),
        }
        if processes > 1:
            command = [sys.executable, "-m", "accelmigrate.launch.verify", "--launch", str(processes), script, *script_args]
        else:
            command = [sys.executable, "-m", RECORDER, script, *script_args]
        cwd = os.path.join(copy_root, os.path.relpath(self.cwd, self.root))
        returncode, output = _run_child(command, env, cwd)
        found = [_read(os.path.join(records, f"rank{rank}.json")) for rank in range(processes)]
        failed = [r for r in found if r is None or r["status"] not in ("stopped", "finished")]
        if returncode != 0 or failed:
            tail = "\n".join(output.strip().splitlines()[-15:]).replace(copy_root, str(self.root))
            raise RunFailed(f"{self.script} ({side}) failed (exit code {returncode}):\n{tail}")
        return found  # type: ignore[return-value]


def _write_script(path: Path, source: SourceText) -> None:
    """The script's copy: a file of its own (never a link into the project),
    in the script's encoding."""
    path.unlink(missing_ok=True)
    path.touch()
    write_atomically(path, source)


def _run_child(command: list[str], env: dict[str, str], cwd: str) -> tuple[int, str]:
    """Run COMMAND in a process group of its own; (exit code, its stderr,
    else its stdout). The group is stopped on the way out, however that is."""
    child = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = child.communicate()
    finally:
        with _signals_held():
            _stop_group(child)
    return child.returncode, stderr or stdout


def _stop_group(child: subprocess.Popen) -> None:
    if child.poll() is None:
        _signal_group(child.pid, signal.SIGTERM)
        try:
            child.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(child.pid, signal.SIGKILL)  # what is left of it (workers of a rank that ended)
    child.wait()
    for stream in (child.stdout, child.stderr):
        if stream is not None:
            stream.close()


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group has ended


def _read(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None
