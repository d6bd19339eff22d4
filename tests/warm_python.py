"""Scripts run by a warm interpreter: a process that has imported torch (and
LibCST) forks one child per script, so that the suite's hundreds of script
runs, torchrun launches and CLI calls do not each pay torch's import (about
1.5 s of CPU, most of a small script's run).

The child is the script's own interpreter from then on: it takes the
script's working directory, environment, argument list and `sys.path[0]`,
runs the script's code in its `__main__` module, and ends as `python
script.py` ends (non-daemon threads joined, `atexit` run, the script's
objects finalized, exit code from `sys.exit`, or 1 with the traceback),
without tearing down torch's modules again;
`python -m module` runs the module as `__main__` (`runpy.run_module`). Any
other command runs as a plain subprocess. What an interpreter reads as it
starts cannot change in a child, so a warm interpreter is kept per set of
start-up variables (`PYTHON*`, the thread counts torch's OpenMP reads as it
loads, ...).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Optional

# What an interpreter and torch read as they start: a child cannot change them.
STARTUP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "LD_", "TORCH", "CUDA_", "MALLOC_")
# The child's side: wait for requests, fork, and run the script in the child.
SERVER = r'''
import json, os, select, sys
import torch  # the import every script would pay
try:
    import libcst  # and every `python -m accelmigrate`
except ImportError:
    pass
import gc
gc.freeze()  # what was imported stays: no collection in a child walks it

def serve():
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.02)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            os.write(1, (json.dumps({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)}) + "\n").encode())
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return None
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return request
            os.write(1, (json.dumps({"started": request["id"], "pid": pid}) + "\n").encode())

def child(request):
    """Become `python script.py`: the script's code runs in this interpreter's own `__main__`."""
    import builtins, random
    random.seed()  # a fresh interpreter's unseeded draws: each child its own
    torch.seed()
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request["module"]:  # `python -m module ...`: sys.path[0] is the working directory
        import runpy
        sys.argv = request["argv"]  # runpy puts the module's file in sys.argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        return
    script = request["script"]
    sys.argv = request["argv"]
    sys.path[0] = os.path.dirname(script)
    with open(script, "rb") as source:
        code = compile(source.read(), script, "exec")
    main = sys.modules["__main__"].__dict__
    main.clear()
    main.update(__name__="__main__", __file__=script, __builtins__=builtins, __doc__=None, __package__=None, __spec__=None, __loader__=None, __cached__=None)
    exec(code, main)

def run_and_end(request):
    """The child's whole life: the script, then what an interpreter's exit does for it (threads joined,
    `atexit` run, its `__main__` finalized, output flushed), short of tearing down the modules imported
    before the fork (about 0.9 s of CPU for torch's, which the script's own exit would pay anyway)."""
    import atexit, gc, os, sys, threading  # the script cleared this module's globals
    try:
        child(request)
        code = 0
    except SystemExit as done:
        code = 0 if done.code is None else done.code
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.modules["__main__"].__dict__.clear()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)

request = serve()
if request is None:
    sys.exit(0)
run_and_end(request)
'''


class WarmProcess:
    """A script running in a child of the warm interpreter, like a `Popen`
    whose output goes to files."""

    def __init__(self, server: "WarmServer", pid: int) -> None:
        self._server, self.pid, self.returncode = server, pid, None

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            found = self._server.returncode_of(self.pid, timeout)
            if found is None:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout)
            self.returncode = found
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class WarmServer:
    """One warm interpreter and the replies it sends (started children,
    their exit codes), read by a thread of this process."""

    def __init__(self, env: dict) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=tempfile.gettempdir(),
        )
        self._lock = threading.Condition()
        self._started: dict[int, int] = {}
        self._ended: dict[int, int] = {}
        self._next_id = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._process.stdout:
            reply = json.loads(line)
            with self._lock:
                if "started" in reply:
                    self._started[reply["started"]] = reply["pid"]
                else:
                    self._ended[reply["pid"]] = reply["returncode"]
                self._lock.notify_all()
        with self._lock:
            self._process.wait()
            self._lock.notify_all()

    def alive(self) -> bool:
        return self._process.poll() is None

    def start(self, module: Optional[str], script: Optional[Path], argv: list[str], env: dict, cwd: Path, stdout: Path, stderr: Path) -> WarmProcess:
        with self._lock:
            request_id, self._next_id = self._next_id, self._next_id + 1
            request = {"id": request_id, "module": module, "script": str(script) if script else None, "argv": argv, "env": env, "cwd": str(cwd), "stdout": str(stdout), "stderr": str(stderr)}
            self._process.stdin.write((json.dumps(request) + "\n").encode())
            self._process.stdin.flush()
            if not self._lock.wait_for(lambda: request_id in self._started or not self.alive(), timeout=60):
                raise RuntimeError("the warm interpreter did not start the script")
            if request_id not in self._started:
                raise RuntimeError("the warm interpreter ended")
            return WarmProcess(self, self._started.pop(request_id))

    def returncode_of(self, pid: int, timeout: Optional[float]) -> Optional[int]:
        """The child's exit code once it ends, None if it runs past `timeout`."""
        with self._lock:
            self._lock.wait_for(lambda: pid in self._ended or not self.alive(), timeout=timeout)
            if pid not in self._ended and not self.alive():
                raise RuntimeError("the warm interpreter ended before its script")
            return self._ended.pop(pid, None)


_servers: dict[tuple, WarmServer] = {}


def _startup_variables(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(STARTUP_PREFIXES)))


def _module_of(command: list[str]) -> Optional[str]:
    """The module of `python -m module ...`, or None."""
    if len(command) >= 3 and command[1] == "-m" and command[2].replace(".", "").replace("_", "").isalnum():
        return command[2]
    return None


def runs_warm(command: list[str]) -> bool:
    """`command` is `python script.py ...` or `python -m module ...` with
    this interpreter (and ACCELMIGRATE_TESTS_COLD, which runs every command
    as a plain subprocess, is not set)."""
    if os.environ.get("ACCELMIGRATE_TESTS_COLD") or len(command) < 2 or command[0] != sys.executable:
        return False
    return _module_of(command) is not None or (command[1].endswith(".py") and not command[1].startswith("-"))


def start(command: list[str], env: dict, cwd: Path, stdout: Path, stderr: Path) -> WarmProcess:
    """`command` (see `runs_warm`) started in a child of the warm interpreter
    for `env`'s start-up variables, its output written to the two files."""
    key = _startup_variables(env)
    server = _servers.get(key)
    if server is None or not server.alive():
        server = _servers[key] = WarmServer(env)
    module = _module_of(command)
    if module is not None:
        return server.start(module, None, [module, *command[3:]], env, cwd, stdout, stderr)
    return server.start(None, Path(cwd, command[1]).resolve(), command[1:], env, cwd, stdout, stderr)


def wait_or_kill(process, timeout: float) -> bool:
    """Wait for `process` (a `Popen` or a `WarmProcess`), killed once it runs
    past `timeout`; whether it did."""
    try:
        process.wait(timeout)
        return False
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return True


def run(command: list[str], env: dict, cwd: Optional[Path], timeout: float, input: Optional[str] = None) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True, ...)`, warm
    where it can be (a command with no `input`)."""
    if not runs_warm(command) or input is not None:
        return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, input=input)
    cwd = cwd or Path.cwd()
    with tempfile.TemporaryDirectory(prefix="warm-run-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        process = start(command, env, cwd, out, err)
        if wait_or_kill(process, timeout):
            raise subprocess.TimeoutExpired(command, timeout)
        return subprocess.CompletedProcess(command, process.returncode, out.read_text(errors="replace"), err.read_text(errors="replace"))
