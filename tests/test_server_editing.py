"""The language server as typing meets it, over real stdio: a burst of
changes is checked once and the last text's diagnostics are published;
quick fixes are the lines that change, for the version they were computed
for; "skip this line" writes the project's mark; the editor's settings and
a changed pyproject.toml count; a large document never holds up other
requests; a `Content-Length` of 100 GB is refused, not allocated."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from test_server import LOOP, LspClient, applied, applied_by_cli, codes, edits_of

pytestmark = pytest.mark.slow  # each test talks to a server process

CAPABILITIES = {
    "textDocument": {"publishDiagnostics": {}},
    "workspace": {"workspaceEdit": {"documentChanges": True}, "didChangeWatchedFiles": {"dynamicRegistration": True}},
}


@pytest.fixture
def editor(tmp_path):
    """A server started as an editor that takes versioned edits starts it."""
    client = LspClient(cwd=str(tmp_path))
    client.request("initialize", {"processId": os.getpid(), "rootUri": tmp_path.as_uri(), "capabilities": CAPABILITIES})
    client.notify("initialized", {})
    yield client
    assert client.close() == 0, client.stderr_text()


def checks_run(client: LspClient) -> int:
    return client.request("accelmigrate/status")["checks_run"]


def quick_fixes(client: LspClient, uri: str, diagnostic: dict) -> dict:
    context = {"diagnostics": [diagnostic]}
    found = client.request("textDocument/codeAction", {"textDocument": {"uri": uri}, "range": diagnostic["range"], "context": context})
    return {action["title"]: action for action in found}


def test_a_burst_of_changes_is_checked_once_and_the_last_text_wins(editor, tmp_path):
    uri = (tmp_path / "typed.py").as_uri()
    editor.open(uri, LOOP)
    assert "AM210" in codes(editor.diagnostics(uri, version=1))
    before = checks_run(editor)
    typed = LOOP.replace("        torch.cuda.empty_cache()\n", "")
    for version in range(2, 22):  # 20 keystrokes' worth of full changes, the last without the empty_cache()
        editor.change(uri, version, LOOP + f"# note {version}\n" if version < 21 else typed)
    assert "AM210" not in codes(editor.diagnostics(uri, version=21))
    assert checks_run(editor) == before + 1
    time.sleep(0.3)  # nothing stale arrives later
    assert not [m for m in editor._pending if m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri]


def test_a_quick_fix_edits_only_the_lines_that_change_of_its_version(editor, tmp_path):
    uri = (tmp_path / "loop.py").as_uri()
    editor.open(uri, LOOP, version=7)
    found = editor.diagnostics(uri, version=7)
    empty_cache = next(d for d in found if d["code"] == "AM210")
    action = quick_fixes(editor, uri, empty_cache)["apply `empty-cache` to this file"]
    (change,) = action["edit"]["documentChanges"]
    assert change["textDocument"] == {"uri": uri, "version": 7}
    (edit,) = edits_of(action["edit"], uri)
    line = empty_cache["range"]["start"]["line"]
    assert edit == {"range": {"start": {"line": line, "character": 0}, "end": {"line": line + 1, "character": 0}}, "newText": ""}
    assert applied(LOOP, action["edit"], uri) == applied_by_cli(tmp_path, "loop.py", LOOP, "empty-cache")


def test_skip_this_line_writes_the_mark_and_silences_the_code(editor, tmp_path):
    uri = (tmp_path / "skipped.py").as_uri()
    editor.open(uri, LOOP)
    empty_cache = next(d for d in editor.diagnostics(uri, version=1) if d["code"] == "AM210")
    action = quick_fixes(editor, uri, empty_cache)["accelmigrate: skip AM210 on this line"]
    marked = applied(LOOP, action["edit"], uri)
    assert "        torch.cuda.empty_cache()  # accelmigrate: skip[AM210]\n" in marked
    editor.change(uri, 2, marked)
    assert "AM210" not in codes(editor.diagnostics(uri, version=2))


@pytest.mark.parametrize(
    "line, edited",
    [
        ("x = 1  # accelmigrate: skip[AM101]\n", "x = 1  # accelmigrate: skip[AM101, AM201]\n"),  # joins the mark there
        ("x = 1  # why\r\n", "x = 1  # why  # accelmigrate: skip[AM201]\r\n"),
        ("x = 1  # accelmigrate: skip[AM201]\n", None),  # already silenced
        ("x = 1 + \\\n", None),  # a comment cannot end a continued line
    ],
)
def test_the_skip_mark_edit(line, edited):
    from pygls.workspace import PositionCodec

    from accelmigrate.server.edits import skip_mark_edit

    text = line + "y = 2\n"
    edit = skip_mark_edit(text, 0, "AM201", PositionCodec())
    if edited is None:
        assert edit is None
    else:
        lines = text.splitlines(keepends=True)
        start, end = edit.range.start.character, edit.range.end.character
        assert lines[0][:start] + edit.new_text + lines[0][end:] == edited


def test_the_editors_settings_and_a_changed_pyproject_count(tmp_path):
    client = LspClient(cwd=str(tmp_path))
    try:
        client.request("initialize", {
            "processId": os.getpid(), "rootUri": tmp_path.as_uri(), "capabilities": CAPABILITIES,
            "initializationOptions": {"to": "empty-cache"},
        })
        client.notify("initialized", {})
        # The server asks to be told of pyproject.toml's changes.
        registration = client.wait_for(lambda m: m.get("method") == "client/registerCapability")
        client.send({"id": registration["id"], "result": None})
        watchers = registration["params"]["registrations"][0]["registerOptions"]["watchers"]
        assert watchers == [{"globPattern": "**/pyproject.toml"}]

        uri = (tmp_path / "train.py").as_uri()
        client.open(uri, LOOP)
        assert codes(client.diagnostics(uri, version=1)) == {"AM210"}
        client.notify("workspace/didChangeConfiguration", {"settings": {"accelmigrate": {"to": "modernize,empty-cache", "ignore": ["AM210"]}}})
        assert codes(client.diagnostics(uri, version=1)) == {"AM220"}

        client.notify("workspace/didChangeConfiguration", {"settings": {"accelmigrate": {}}})
        assert codes(client.diagnostics(uri, version=1)) == {"AM107", "AM210", "AM220"}
        (tmp_path / "pyproject.toml").write_text('[tool.accelmigrate]\nselect = ["AM22"]\n')
        client.notify("workspace/didChangeWatchedFiles", {"changes": [{"uri": (tmp_path / "pyproject.toml").as_uri(), "type": 1}]})
        assert codes(client.diagnostics(uri, version=1)) == {"AM220"}
    finally:
        assert client.close() == 0, client.stderr_text()


def test_a_large_document_never_holds_up_other_requests(editor, tmp_path):
    """A document over 256 KB (most of it a table of comments, so that its
    check stays cheap here) waits for a longer pause and is checked off the
    request path: a request in between is answered at once."""
    uri = (tmp_path / "large.py").as_uri()
    table = "".join(f"# row {i:06d} " + "x" * 60 + "\n" for i in range(4000))
    text = "import torch\n\n" + table + "for step in range(3):\n    torch.cuda.empty_cache()\n"
    assert len(text) > 256 * 1024
    editor.open(uri, text)
    editor.diagnostics(uri, version=1, timeout=240)
    started = time.monotonic()
    editor.change(uri, 2, text + "# edited\n")
    assert editor.request("accelmigrate/status")["pid"] == editor.process.pid
    assert time.monotonic() - started < 0.5  # answered before the large document's pause is over
    found = editor.diagnostics(uri, version=2, timeout=240)
    assert [d["code"] for d in found] == ["AM210"]


def test_a_message_too_large_is_refused_not_allocated(tmp_path):
    server = subprocess.Popen(
        [sys.executable, "-m", "accelmigrate", "server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    server.stdin.write(b"Content-Length: 100000000000\r\n\r\n{}")
    server.stdin.close()
    assert server.wait(timeout=60) == 0
    assert b"dropped a message of 100000000000 bytes" in server.stderr.read()
