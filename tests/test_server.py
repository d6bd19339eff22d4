"""`accelmigrate server` driven as an editor drives it: one process over real
stdio pipes (LSP frames with Content-Length headers), initialize, didOpen,
didChange, codeAction, shutdown, exit."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accelmigrate.server import notebooks as server_notebooks
from conftest import ROOT, SCRIPTS

_spec = importlib.util.spec_from_file_location("server_latency", ROOT / "benchmarks" / "server_latency.py")
server_latency = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(server_latency)
LspClient = server_latency.LspClient

pytestmark = pytest.mark.slow  # each test talks to a server process

# A training loop with an empty_cache() in the loop and `loss.data[0]`, and a
# DataLoader of in-memory tensors (a note: no workers needed).
LOOP = '''\
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch.cuda.empty_cache()
        print(loss.data[0])


if __name__ == "__main__":
    main()
'''


@pytest.fixture(scope="module")
def client():
    client = LspClient()
    client.initialize(ROOT)
    yield client
    assert client.close() == 0, client.stderr_text()


def codes(diagnostics: list[dict]) -> set[str]:
    return {d.get("code") for d in diagnostics}


def offset(text: str, position: dict) -> int:
    """An LSP position (UTF-16 code units, lines ended by \\n, \\r\\n or \\r) as an index into TEXT."""
    lines = text.splitlines(keepends=True) if text else []
    start = sum(len(line) for line in lines[: position["line"]])
    if position["line"] >= len(lines):
        return len(text)
    units, line = position["character"], lines[position["line"]]
    column = 0
    while units > 0 and column < len(line):
        units -= 2 if ord(line[column]) > 0xFFFF else 1
        column += 1
    return start + column


def edits_of(edit: dict, uri: str) -> list[dict]:
    """A WorkspaceEdit's edits of URI, given as `changes` or as `documentChanges`."""
    if "documentChanges" in edit:
        return [e for change in edit["documentChanges"] if change["textDocument"]["uri"] == uri for e in change["edits"]]
    return edit["changes"].get(uri, [])


def applied(text: str, edit: dict, uri: str) -> str:
    for change in sorted(edits_of(edit, uri), key=lambda e: (e["range"]["start"]["line"], e["range"]["start"]["character"]), reverse=True):
        text = text[: offset(text, change["range"]["start"])] + change["newText"] + text[offset(text, change["range"]["end"]):]
    return text


def applied_by_cli(tmp_path: Path, name: str, text: str, *words: str) -> str:
    """What `accelmigrate apply [--to WORDS]` writes for a file holding TEXT (a copy beside NAME)."""
    copy = tmp_path / "cli" / name
    copy.parent.mkdir(exist_ok=True)
    if (tmp_path / "pyproject.toml").exists():
        shutil.copy(tmp_path / "pyproject.toml", copy.parent / "pyproject.toml")
    copy.write_bytes(text.encode("utf-8"))
    args = ["--to", *words] if words else []
    done = subprocess.run([sys.executable, "-m", "accelmigrate", "apply", "--no-cache", *args, str(copy)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return copy.read_bytes().decode("utf-8")


def actions(client: LspClient, uri: str, diagnostics: list[dict], only=None) -> list[dict]:
    context = {"diagnostics": diagnostics, **({"only": only} if only else {})}
    whole = {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}}
    ranges = [d["range"] for d in diagnostics] or [whole]
    found = []
    for place in ranges:
        found += client.request("textDocument/codeAction", {"textDocument": {"uri": uri}, "range": place, "context": context})
    return list({a["title"]: a for a in found}.values())


def test_diagnostics_changes_and_fixes_match_apply(client, tmp_path):
    script = tmp_path / "train.py"
    shutil.copy(SCRIPTS / "char_lstm.py", script)
    text = script.read_text(encoding="utf-8")
    uri = script.as_uri()
    pid = client.request("accelmigrate/status")["pid"]

    client.open(uri, text)
    found = client.diagnostics(uri, version=1)
    assert codes(found) == {"AM107", "AM201"}  # its in-memory dataset keeps loading in the main process (a note)
    kept = next(d for d in found if d["code"] == "AM201")
    assert kept["range"]["start"] == {"line": 57, "character": 12}  # check's 58:13
    assert kept["severity"] == 2 and kept["source"] == "accelmigrate"
    assert "fixable with `accelmigrate apply --to item`" in kept["message"]

    # Each quick fix is exactly `apply --to WORD`; fix all is `apply` with the configured words.
    offered = actions(client, uri, found)
    by_title = {a["title"]: a for a in offered}
    assert set(by_title) == {
        "apply `item` to this file", "accelmigrate: skip AM201 on this line", "accelmigrate: fix all (apply the configured codemods)"
    }
    for word in ("item",):
        action = by_title[f"apply `{word}` to this file"]
        assert action["kind"] == "quickfix"
        assert applied(text, action["edit"], uri) == applied_by_cli(tmp_path, "train.py", text, word)
    fix_all = actions(client, uri, [], only=["source.fixAll"])
    assert [a["kind"] for a in fix_all] == ["source.fixAll.accelmigrate"]
    fixed = applied(text, fix_all[0]["edit"], uri)
    assert fixed == applied_by_cli(tmp_path, "train.py", text)

    # An incremental change re-checks the new text in the same process.
    line = text.splitlines().index("        total_loss = 0")
    client.notify(
        "textDocument/didChange",
        {
            "textDocument": {"uri": uri, "version": 2},
            "contentChanges": [{"range": {"start": {"line": line, "character": 8}, "end": {"line": line, "character": 8}}, "text": "total_loss = 0.0  # é𝛼\n        "}],
        },
    )
    assert codes(client.diagnostics(uri, version=2)) == {"AM107", "AM201"}
    # A full change that removes the problems leaves the note alone.
    client.change(uri, 3, fixed)
    assert codes(client.diagnostics(uri, version=3)) == {"AM107"}
    checks = client.request("accelmigrate/status")["checks_run"]
    assert actions(client, uri, []) == []
    client.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
    assert codes(client.diagnostics(uri)) == {"AM107"}
    status = client.request("accelmigrate/status")
    assert status["checks_run"] == checks  # the same text again: answered from the document's entry
    assert status["pid"] == pid == client.process.pid  # one process throughout
    assert status["torch_imported"] is False


def test_code_action_follows_the_buffer_and_fixes_a_loop(client, tmp_path):
    script = tmp_path / "loop.py"
    uri = script.as_uri()  # never written: the server checks the buffer
    client.open(uri, LOOP)
    found = client.diagnostics(uri, version=1)
    assert codes(found) == {"AM107", "AM210", "AM220"}
    assert next(d for d in found if d["code"] == "AM107")["severity"] == 3  # a note (tensors in memory): information
    empty_cache = next(d for d in found if d["code"] == "AM210")
    (action,) = [a for a in actions(client, uri, [empty_cache]) if a["kind"] == "quickfix" and a["title"].startswith("apply")]
    assert action["title"] == "apply `empty-cache` to this file"
    assert action["diagnostics"][0]["code"] == "AM210"
    assert applied(LOOP, action["edit"], uri) == applied_by_cli(tmp_path, "loop.py", LOOP, "empty-cache")
    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert client.diagnostics(uri) == []


def test_hover_shows_the_explain_entry(client, tmp_path):
    uri = (tmp_path / "hover.py").as_uri()
    client.open(uri, LOOP)
    found = client.diagnostics(uri, version=1)
    empty_cache = next(d for d in found if d["code"] == "AM210")
    hover = client.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": empty_cache["range"]["start"]})
    explained = subprocess.run([sys.executable, "-m", "accelmigrate", "explain", "AM210"], capture_output=True, text=True).stdout
    assert explained.strip() in hover["contents"]["value"]


def test_a_document_that_does_not_parse_is_one_error_at_its_line(client, tmp_path):
    uri = (tmp_path / "broken.py").as_uri()
    client.open(uri, "import torch\n\nfor x in range(3)\n    torch.cuda.empty_cache()\n")
    (error,) = client.diagnostics(uri, version=1)
    assert error["severity"] == 1 and error["range"]["start"]["line"] == 2
    assert "syntax" in error["message"]
    client.change(uri, 2, LOOP)  # and the server goes on
    assert "AM210" in codes(client.diagnostics(uri, version=2))


def test_nearest_pyproject_chooses_the_words(client, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.accelmigrate]\nto = ["empty-cache"]\n', encoding="utf-8")
    uri = (tmp_path / "configured.py").as_uri()
    client.open(uri, LOOP)
    assert codes(client.diagnostics(uri, version=1)) == {"AM210"}
    (fix_all,) = actions(client, uri, [], only=["source.fixAll.accelmigrate"])
    assert applied(LOOP, fix_all["edit"], uri) == applied_by_cli(tmp_path, "configured.py", LOOP)

    # An ignored code is neither reported nor fixed, as by the CLI.
    (tmp_path / "pyproject.toml").write_text('[tool.accelmigrate]\nignore = ["AM210"]\n', encoding="utf-8")
    client.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
    assert codes(client.diagnostics(uri)) == {"AM107", "AM220"}
    (fix_all,) = actions(client, uri, [], only=["source.fixAll.accelmigrate"])
    fixed = applied(LOOP, fix_all["edit"], uri)
    assert "torch.cuda.empty_cache()" in fixed and fixed == applied_by_cli(tmp_path, "configured.py", LOOP)

    (tmp_path / "pyproject.toml").write_text('[tool.accelmigrate]\ntoo = ["item"]\n', encoding="utf-8")
    client.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
    (mistake,) = client.diagnostics(uri)
    assert mistake["severity"] == 1 and "pyproject.toml" in mistake["message"] and "too" in mistake["message"]

    (tmp_path / "pyproject.toml").write_text("[tool.accelmigrate]\nto = " + "[" * 1000 + "]" * 1000 + "\n", encoding="utf-8")
    client.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
    (mistake,) = client.diagnostics(uri)  # one diagnostic, not an internal error
    assert mistake["severity"] == 1 and "pyproject.toml: cannot read the configuration: nested too deeply" in mistake["message"]


def test_notebook_findings_point_into_its_json(client, tmp_path):
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# Train\n"]},
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": LOOP.splitlines(keepends=True)[:17]},
    ]
    metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}, "language_info": {"name": "python"}}
    text = json.dumps({"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n"
    uri = (tmp_path / "train.ipynb").as_uri()
    client.open(uri, text)
    found = client.diagnostics(uri, version=1)
    empty_cache = next(d for d in found if d["code"] == "AM210")
    lines = text.splitlines()
    start, end = empty_cache["range"]["start"], empty_cache["range"]["end"]
    assert json.loads(lines[start["line"]][start["character"] : end["character"]]) == "        torch.cuda.empty_cache()\n"
    assert empty_cache["message"].startswith("cell 2, line 15: ")
    assert next(d for d in found if d["code"] == "AM001")["severity"] == 3  # a note: information
    (fix_all,) = actions(client, uri, [], only=["source.fixAll"])
    assert applied(text, fix_all["edit"], uri) == applied_by_cli(tmp_path, "train.ipynb", text)


def test_notebook_document_cells_are_checked_together(client, tmp_path):
    """VS Code's notebook editor sends a notebook as cells (notebookDocument/*)."""
    notebook_uri = (tmp_path / "cells.ipynb").as_uri()
    imports, loop = LOOP.split("\n\n\ndef main():\n")
    loop = "\n".join(line[4:] for line in loop.split("\n\n\nif")[0].splitlines())  # the body, at the top level
    sources = ["# Training", imports, loop]
    cells = [f"vscode-notebook-cell:{tmp_path}/cells.ipynb#cell{i}" for i in range(3)]
    client.notify(
        "notebookDocument/didOpen",
        {
            "notebookDocument": {
                "uri": notebook_uri, "notebookType": "jupyter-notebook", "version": 1,
                "cells": [{"kind": 1 if i == 0 else 2, "document": uri} for i, uri in enumerate(cells)],
            },
            "cellTextDocuments": [
                {"uri": uri, "languageId": "markdown" if i == 0 else "python", "version": 1, "text": text}
                for i, (uri, text) in enumerate(zip(cells, sources))
            ],
        },
    )
    found = {uri: client.diagnostics(uri) for uri in cells}
    assert found[cells[0]] == [] and codes(found[cells[2]]) >= {"AM210", "AM220"}
    empty_cache = next(d for d in found[cells[2]] if d["code"] == "AM210")
    assert loop.splitlines()[empty_cache["range"]["start"]["line"]].strip() == "torch.cuda.empty_cache()"

    (fix,) = [a for a in actions(client, cells[2], [empty_cache]) if a["kind"] == "quickfix" and a["title"].startswith("apply")]
    fixed = [applied(text, fix["edit"], uri) for uri, text in zip(cells, sources)]
    expected = server_notebooks.cell_texts(applied_by_cli(tmp_path, "cells.ipynb", server_notebooks.notebook_json(list(zip([False, True, True], sources))), "empty-cache"))
    assert fixed == expected and fixed[2] != sources[2]

    client.notify(
        "notebookDocument/didChange",
        {
            "notebookDocument": {"uri": notebook_uri, "version": 2},
            "change": {"cells": {"textContent": [{"document": {"uri": cells[2], "version": 2}, "changes": [{"text": fixed[2]}]}]}},
        },
    )
    assert "AM210" not in codes(client.diagnostics(cells[2], version=2))


def test_latency_benchmark_measures_a_warm_server():
    assert 0 < server_latency.measure_did_change_latency(SCRIPTS / "char_lstm.py", changes=3) < 5
    elapsed, checks = server_latency.measure_burst(SCRIPTS / "char_lstm.py", changes=5)
    assert elapsed > 0 and checks == 1


def test_without_pygls_the_command_says_how_to_install_it():
    hide = "import sys; sys.modules['pygls'] = None; from accelmigrate.cli import main; main(['server'])"
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and "pip install 'accelmigrate[server]'" in done.stderr, done.stderr
