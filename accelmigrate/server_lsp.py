"""The language server's features (pygls): the handlers `accelmigrate server`
runs. What the server does, for whom and why, is in `accelmigrate/server.py`."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from typing import Optional
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from accelmigrate import __version__
from accelmigrate.server_diagnostics import SOURCE, Positions, cell_diagnostics, explanation, file_diagnostics
from accelmigrate.server_documents import Checked, Documents
from accelmigrate.server_notebooks import cell_texts, notebook_json

FIX_ALL = "source.fixAll.accelmigrate"
FIX_ALL_TITLE = "accelmigrate: fix all (apply the configured codemods)"
STATUS = "accelmigrate/status"  # a custom request: pid, checks run, whether torch is imported
NOTEBOOKS = types.NotebookDocumentSyncOptions(
    notebook_selector=[types.NotebookDocumentFilterWithCells(notebook="jupyter-notebook", cells=[types.NotebookCellLanguage("python")])],
    save=True,
)


class AccelmigrateServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(
            SOURCE, __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental, notebook_document_sync=NOTEBOOKS
        )
        self.documents = Documents()


server = AccelmigrateServer()


def document_path(uri: str) -> str:
    """The file a `file:` URI names; an unsaved buffer gets its name in the current folder."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        path = unquote(parsed.path)
        return path[1:] if os.name == "nt" and re.match(r"/[A-Za-z]:", path) else path
    return os.path.join(os.getcwd(), os.path.basename(unquote(parsed.path)) or "untitled.py")


@dataclasses.dataclass(frozen=True)
class Target:
    """What one check covers: a text document, or a notebook document whose
    cells (`cells`: their URIs, in order) are checked together as its JSON."""

    uri: str
    path: str
    text: str
    cells: Optional[tuple[str, ...]] = None
    cell_sources: tuple[str, ...] = ()


def target_of(ls: AccelmigrateServer, uri: str, language_id: Optional[str] = None) -> Optional[Target]:
    notebook = ls.workspace.get_notebook_document(notebook_uri=uri) or ls.workspace.get_notebook_document(cell_uri=uri)
    if notebook is not None:
        cells = [(cell, ls.workspace.get_text_document(cell.document)) for cell in notebook.cells]
        is_code = [cell.kind == types.NotebookCellKind.Code and document.language_id in (None, "python") for cell, document in cells]
        sources = tuple(document.source for _, document in cells)
        text = notebook_json(list(zip(is_code, sources)))
        path = document_path(notebook.uri)
        return Target(notebook.uri, path if path.endswith(".ipynb") else path + ".ipynb", text, tuple(c.document for c, _ in cells), sources)
    path = document_path(uri)
    cell_of_unsynced_notebook = urlparse(uri).scheme != "file" and path.endswith(".ipynb")
    if cell_of_unsynced_notebook or not (path.endswith((".py", ".ipynb")) or language_id == "python"):
        return None
    return Target(uri, path, ls.workspace.get_text_document(uri).source)


def check(ls: AccelmigrateServer, target: Target) -> Checked:
    return ls.documents.check(target.uri, target.path, target.text)


def diagnostics_of(ls: AccelmigrateServer, target: Target, checked: Checked) -> dict[str, list[types.Diagnostic]]:
    """The diagnostics of each document the target covers (every cell of a notebook, to clear those without)."""
    codec = ls.workspace.position_codec
    if target.cells is None:
        return {target.uri: file_diagnostics(checked, codec)}
    return dict(zip(target.cells, cell_diagnostics(checked, list(target.cell_sources), codec)))


def publish(ls: AccelmigrateServer, uri: str, language_id: Optional[str] = None) -> None:
    target = target_of(ls, uri, language_id)
    if target is None:
        return
    for document_uri, found in diagnostics_of(ls, target, check(ls, target)).items():
        version = ls.workspace.get_text_document(document_uri).version
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=document_uri, diagnostics=found, version=version))


def clear(ls: AccelmigrateServer, *uris: str) -> None:
    for uri in uris:
        ls.documents.forget(uri)
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: AccelmigrateServer, params: types.DidOpenTextDocumentParams) -> None:
    publish(ls, params.text_document.uri, params.text_document.language_id)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: AccelmigrateServer, params: types.DidChangeTextDocumentParams) -> None:
    publish(ls, params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
def did_save(ls: AccelmigrateServer, params: types.DidSaveTextDocumentParams) -> None:
    publish(ls, params.text_document.uri)  # pyproject.toml may have changed meanwhile


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: AccelmigrateServer, params: types.DidCloseTextDocumentParams) -> None:
    clear(ls, params.text_document.uri)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
def notebook_did_open(ls: AccelmigrateServer, params: types.DidOpenNotebookDocumentParams) -> None:
    publish(ls, params.notebook_document.uri)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)
def notebook_did_change(ls: AccelmigrateServer, params: types.DidChangeNotebookDocumentParams) -> None:
    closed = (params.change.cells.structure.did_close or []) if params.change.cells and params.change.cells.structure else []
    clear(ls, *(cell.uri for cell in closed))
    publish(ls, params.notebook_document.uri)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)
def notebook_did_save(ls: AccelmigrateServer, params: types.DidSaveNotebookDocumentParams) -> None:
    publish(ls, params.notebook_document.uri)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_CLOSE)
def notebook_did_close(ls: AccelmigrateServer, params: types.DidCloseNotebookDocumentParams) -> None:
    ls.documents.forget(params.notebook_document.uri)
    clear(ls, *(cell.uri for cell in params.cell_text_documents))


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL], resolve_provider=False),
)
def code_action(ls: AccelmigrateServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    uri = params.text_document.uri
    target = target_of(ls, uri)
    if target is None:
        return []
    checked = check(ls, target)
    wanted = params.context.only
    actions: list[types.CodeAction] = []
    if _wanted(types.CodeActionKind.QuickFix, wanted):
        current = diagnostics_of(ls, target, checked).get(uri, [])
        asked = {(d.code, d.range.start.line) for d in params.context.diagnostics if d.source == SOURCE}
        fixing = [d for d in current if (d.data or {}).get("fixable") and ((d.code, d.range.start.line) in asked or _overlaps(d.range, params.range))]
        for word in dict.fromkeys(d.data["word"] for d in fixing):
            action = _replacing(ls, target, word, f"apply `{word}` to this file", types.CodeActionKind.QuickFix)
            if action is not None:
                action.diagnostics = [d for d in fixing if d.data["word"] == word]
                action.is_preferred = True
                actions.append(action)
    if _wanted(FIX_ALL, wanted):
        action = _replacing(ls, target, None, FIX_ALL_TITLE, FIX_ALL)
        if action is not None:
            actions.append(action)
    return actions


def _replacing(ls: AccelmigrateServer, target: Target, words: Optional[str], title: str, kind) -> Optional[types.CodeAction]:
    """An action whose edit makes the document what `apply --to WORDS` writes
    (the whole text, or each cell that changes); None when that changes nothing."""
    result = ls.documents.migrated(target.uri, target.path, target.text, words)
    if result.error is not None or result.migrated is None or result.migrated == target.text:
        return None
    codec = ls.workspace.position_codec
    if target.cells is None:
        changes = {target.uri: [types.TextEdit(Positions(target.text, codec).whole(), result.migrated)]}
    else:
        changes = {
            uri: [types.TextEdit(Positions(old, codec).whole(), new)]
            for uri, old, new in zip(target.cells, target.cell_sources, cell_texts(result.migrated))
            if new != old
        }
    return types.CodeAction(title=title, kind=kind, edit=types.WorkspaceEdit(changes=changes))


def _wanted(kind, only) -> bool:
    """Whether the client asked for KIND: no `only`, or a kind that KIND is (`source` covers `source.fixAll...`)."""
    kind = getattr(kind, "value", kind)
    return not only or any(kind == k or kind.startswith(f"{k}.") for k in (getattr(k, "value", k) for k in only))


def _overlaps(a: types.Range, b: types.Range) -> bool:
    key = lambda p: (p.line, p.character)  # noqa: E731
    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


@server.feature(types.TEXT_DOCUMENT_HOVER)
def hover(ls: AccelmigrateServer, params: types.HoverParams) -> Optional[types.Hover]:
    """The `explain` entry of each finding on the hovered line."""
    target = target_of(ls, params.text_document.uri)
    if target is None:
        return None
    found = diagnostics_of(ls, target, check(ls, target)).get(params.text_document.uri, [])
    here = {d.code: d for d in found if d.code and d.range.start.line <= params.position.line <= d.range.end.line}
    if not here:
        return None
    entries = [explanation(str(code), (d.data or {}).get("word", "").split("=", 1)[0]) for code, d in here.items()]
    return types.Hover(types.MarkupContent(types.MarkupKind.Markdown, "\n\n---\n\n".join(f"```text\n{e}\n```" for e in entries)))


@server.feature(STATUS)
def status(ls: AccelmigrateServer, params=None) -> dict:
    return {"pid": os.getpid(), "checks_run": ls.documents.checks_run, "torch_imported": "torch" in sys.modules}
