"""How long an editor waits for `accelmigrate server`'s findings after an edit.

    python benchmarks/server_latency.py [SCRIPT]

Starts the server over stdio as an editor does, opens SCRIPT (by default
fixtures/scripts/char_lstm.py, a training script), then sends several
didChange notifications, each a new text (a comment line appended, so every
change is a real re-check, never a cached one), and prints the median time
from sending one to receiving its publishDiagnostics. The process's start-up
and first check are not counted: a warm server is what an editor talks to.
Then the burst case: 20 changes sent at once, as fast typing sends them; it
prints the time from the last one to the diagnostics of its text and how
many checks the burst cost (the server checks a burst once, after it).

`LspClient` is a minimal LSP client over real pipes (Content-Length frames,
JSON-RPC), used by tests/test_server.py too.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SCRIPT = ROOT / "fixtures" / "scripts" / "char_lstm.py"
SERVER_COMMAND = [sys.executable, "-m", "accelmigrate", "server"]


class LspClient:
    """Talks to a language server process: requests wait for their response;
    notifications from the server are queued for `wait_for`."""

    def __init__(self, command: Optional[list[str]] = None, cwd: Optional[str] = None, env: Optional[dict] = None) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            command or SERVER_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, cwd=cwd, env=env
        )
        self._ids = itertools.count(1)
        self._messages: "queue.Queue[dict]" = queue.Queue()
        self._pending: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        stream = self.process.stdout
        while True:
            length = None
            while True:
                header = stream.readline()
                if not header:
                    return
                if header in (b"\r\n", b"\n"):
                    break
                name, _, value = header.decode("ascii").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            self._messages.put(json.loads(stream.read(length)))

    def send(self, message: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode("utf-8")
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def notify(self, method: str, params: Any = None) -> None:
        self.send({"method": method, "params": params})

    def request(self, method: str, params: Any = None, timeout: float = 60) -> Any:
        number = next(self._ids)
        self.send({"id": number, "method": method, "params": params})
        reply = self.wait_for(lambda m: m.get("id") == number and "method" not in m, timeout)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result")

    def wait_for(self, matches: Callable[[dict], bool], timeout: float = 60) -> dict:
        """The first message (kept or new) that MATCHES; the others are kept for later."""
        for i, message in enumerate(self._pending):
            if matches(message):
                return self._pending.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching message from the server; stderr:\n{self.stderr_text()}")
            try:
                message = self._messages.get(timeout=left)
            except queue.Empty:
                continue
            if matches(message):
                return message
            self._pending.append(message)

    def diagnostics(self, uri: str, version: Optional[int] = None, timeout: float = 60) -> list[dict]:
        """The next publishDiagnostics for URI (for that document version, when given)."""
        message = self.wait_for(
            lambda m: m.get("method") == "textDocument/publishDiagnostics"
            and m["params"]["uri"] == uri
            and (version is None or m["params"].get("version") == version),
            timeout,
        )
        return message["params"]["diagnostics"]

    def initialize(self, root: Path) -> dict:
        result = self.request(
            "initialize",
            {"processId": os.getpid(), "rootUri": root.as_uri(), "capabilities": {"textDocument": {"publishDiagnostics": {}}}},
        )
        self.notify("initialized", {})
        return result

    def open(self, uri: str, text: str, version: int = 1) -> None:
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": version, "text": text}})

    def change(self, uri: str, version: int, text: str) -> None:
        self.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]})

    def close(self, timeout: float = 30) -> int:
        """shutdown, exit; the server's exit code."""
        try:
            self.request("shutdown", None, timeout)
            self.notify("exit")
            return self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self.stderr.close()

    def stderr_text(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")


@contextlib.contextmanager
def opened(path: Path | str) -> Iterator[tuple[LspClient, str, str]]:
    """A warm server with PATH open and checked once (imports and all): the
    client, the document's URI and its text."""
    path = Path(path).resolve()
    text = path.read_text(encoding="utf-8")
    client = LspClient(cwd=str(path.parent))
    try:
        client.initialize(path.parent)
        uri = path.as_uri()
        client.open(uri, text)
        client.diagnostics(uri, version=1, timeout=120)
        yield client, uri, text
    finally:
        client.close()


def measure_did_change_latency(path: Path | str = DEFAULT_SCRIPT, changes: int = 7) -> float:
    """Median seconds from sending didChange to receiving its diagnostics."""
    with opened(path) as (client, uri, text):
        times = []
        for version in range(2, changes + 2):
            changed = text + f"# edit {version}\n"
            start = time.perf_counter()
            client.change(uri, version, changed)
            client.diagnostics(uri, version=version)
            times.append(time.perf_counter() - start)
        return statistics.median(times)


def measure_burst(path: Path | str = DEFAULT_SCRIPT, changes: int = 20) -> tuple[float, int]:
    """Seconds from the last of a burst of CHANGES didChange notifications
    to the diagnostics of its text, and the checks the burst cost."""
    with opened(path) as (client, uri, text):
        before = client.request("accelmigrate/status")["checks_run"]
        for version in range(2, changes + 2):
            client.change(uri, version, text + f"# keystroke {version}\n")
        start = time.perf_counter()
        client.diagnostics(uri, version=changes + 1)
        elapsed = time.perf_counter() - start
        return elapsed, client.request("accelmigrate/status")["checks_run"] - before


if __name__ == "__main__":
    script = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SCRIPT
    print(f"server didChange -> diagnostics on {script.name}: {measure_did_change_latency(script) * 1000:.0f} ms (median)")
    burst, checks = measure_burst(script)
    print(f"server burst of 20 changes on {script.name}: last change -> its diagnostics {burst * 1000:.0f} ms, {checks} check(s)")
