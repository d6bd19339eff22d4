"""The language server's features (pygls): the handlers `accelmigrate server`
runs. What the server does, for whom and why, is in `accelmigrate/server/serve.py`.

Checks run off the request path, one at a time, on a thread of their own:
a change is checked once the document has been quiet for DEBOUNCE_SECONDS
(LARGE_DEBOUNCE_SECONDS for a large one), so a burst of keystrokes is one
check, and the newest text wins: a check that a newer change overtook
publishes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Optional
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from accelmigrate import __version__
from accelmigrate.server.diagnostics import SOURCE, cell_diagnostics, explanation, file_diagnostics
from accelmigrate.server.documents import Checked, Documents, Overrides
from accelmigrate.server.edits import minimal_edits, skip_mark_edit, workspace_edit
from accelmigrate.server.notebooks import cell_texts, notebook_json

FIX_ALL = "source.fixAll.accelmigrate"
FIX_ALL_TITLE = "accelmigrate: fix all (apply the configured codemods)"
STATUS = "accelmigrate/status"  # a custom request: pid, checks run, whether torch is imported
DEBOUNCE_SECONDS = 0.05
LARGE_DEBOUNCE_SECONDS = 1.0
LARGE_DOCUMENT_CHARACTERS = 256 * 1024  # where a check costs seconds: wait for a longer pause
SETTINGS_SECTION = "accelmigrate"  # {"to": "ddp,amp", "select": ["AM1"], "ignore": ["AM104"]}
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
        self.overrides = Overrides()  # the editor's settings, over pyproject.toml's
        self.checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accelmigrate-check")
        self.generations: dict[str, int] = {}  # target URI -> its latest scheduled check

    async def checked(self, target: "Target") -> Checked:
        """`check` of the target's text, computed on the checker's thread."""
        return await asyncio.get_running_loop().run_in_executor(self.checker, check, self, target)


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
    return ls.documents.check(target.uri, target.path, target.text, ls.overrides)


def diagnostics_of(ls: AccelmigrateServer, target: Target, checked: Checked) -> dict[str, list[types.Diagnostic]]:
    """The diagnostics of each document the target covers (every cell of a notebook, to clear those without)."""
    codec = ls.workspace.position_codec
    if target.cells is None:
        return {target.uri: file_diagnostics(checked, codec)}
    return dict(zip(target.cells, cell_diagnostics(checked, list(target.cell_sources), codec)))


async def publish(ls: AccelmigrateServer, uri: str, language_id: Optional[str] = None, *, debounce: bool = False) -> None:
    """Check the document (or the notebook it is a cell of) and publish its
    diagnostics; with `debounce`, once it has been quiet for a while. A
    newer change or a close overtakes it: it then publishes nothing."""
    target = target_of(ls, uri, language_id)
    if target is None:
        return
    generation = ls.generations[target.uri] = ls.generations.get(target.uri, 0) + 1
    if debounce:
        await asyncio.sleep(LARGE_DEBOUNCE_SECONDS if len(target.text) > LARGE_DOCUMENT_CHARACTERS else DEBOUNCE_SECONDS)
        if ls.generations.get(target.uri) != generation:
            return
        target = target_of(ls, uri, language_id)
        if target is None:
            return
    checked = await ls.checked(target)
    if ls.generations.get(target.uri) != generation:
        return
    for document_uri, found in diagnostics_of(ls, target, checked).items():
        version = ls.workspace.get_text_document(document_uri).version
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=document_uri, diagnostics=found, version=version))


async def publish_all(ls: AccelmigrateServer) -> None:
    """Every open document again (the settings or a pyproject.toml changed)."""
    uris = [notebook.uri for notebook in ls.workspace.notebook_documents.values()]
    cells = {cell.document for notebook in ls.workspace.notebook_documents.values() for cell in notebook.cells}
    uris += [uri for uri in ls.workspace.text_documents if uri not in cells]
    for uri in uris:
        await publish(ls, uri)


def clear(ls: AccelmigrateServer, *uris: str) -> None:
    for uri in uris:
        ls.generations[uri] = ls.generations.get(uri, 0) + 1  # a check under way publishes nothing
        ls.documents.forget(uri)
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


@server.feature(types.INITIALIZE)
def initialize(ls: AccelmigrateServer, params: types.InitializeParams) -> None:
    ls.overrides = Overrides.of(params.initialization_options)


@server.feature(types.INITIALIZED)
async def initialized(ls: AccelmigrateServer, params: types.InitializedParams) -> None:
    """Ask the editor to report changes of pyproject.toml, where it can."""
    watching = ls.client_capabilities.workspace and ls.client_capabilities.workspace.did_change_watched_files
    if watching and watching.dynamic_registration:
        options = types.DidChangeWatchedFilesRegistrationOptions(watchers=[types.FileSystemWatcher(glob_pattern="**/pyproject.toml")])
        registration = types.Registration(id="accelmigrate-pyproject", method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES, register_options=options)
        await ls.client_register_capability_async(types.RegistrationParams(registrations=[registration]))


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def did_change_configuration(ls: AccelmigrateServer, params: types.DidChangeConfigurationParams) -> None:
    settings = params.settings
    if isinstance(settings, dict) and isinstance(settings.get(SETTINGS_SECTION), dict):
        settings = settings[SETTINGS_SECTION]
    ls.overrides = Overrides.of(settings)
    await publish_all(ls)


@server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
async def did_change_watched_files(ls: AccelmigrateServer, params: types.DidChangeWatchedFilesParams) -> None:
    if any(change.uri.endswith("pyproject.toml") for change in params.changes):
        await publish_all(ls)  # the settings are read again for each document


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
async def did_open(ls: AccelmigrateServer, params: types.DidOpenTextDocumentParams) -> None:
    await publish(ls, params.text_document.uri, params.text_document.language_id)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
async def did_change(ls: AccelmigrateServer, params: types.DidChangeTextDocumentParams) -> None:
    await publish(ls, params.text_document.uri, debounce=True)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
async def did_save(ls: AccelmigrateServer, params: types.DidSaveTextDocumentParams) -> None:
    await publish(ls, params.text_document.uri)  # pyproject.toml may have changed meanwhile


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: AccelmigrateServer, params: types.DidCloseTextDocumentParams) -> None:
    clear(ls, params.text_document.uri)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
async def notebook_did_open(ls: AccelmigrateServer, params: types.DidOpenNotebookDocumentParams) -> None:
    await publish(ls, params.notebook_document.uri)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)
async def notebook_did_change(ls: AccelmigrateServer, params: types.DidChangeNotebookDocumentParams) -> None:
    closed = (params.change.cells.structure.did_close or []) if params.change.cells and params.change.cells.structure else []
    clear(ls, *(cell.uri for cell in closed))
    await publish(ls, params.notebook_document.uri, debounce=True)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)
async def notebook_did_save(ls: AccelmigrateServer, params: types.DidSaveNotebookDocumentParams) -> None:
    await publish(ls, params.notebook_document.uri)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_CLOSE)
def notebook_did_close(ls: AccelmigrateServer, params: types.DidCloseNotebookDocumentParams) -> None:
    uri = params.notebook_document.uri
    ls.generations[uri] = ls.generations.get(uri, 0) + 1  # a check under way publishes nothing
    ls.documents.forget(uri)
    clear(ls, *(cell.uri for cell in params.cell_text_documents))


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL], resolve_provider=False),
)
async def code_action(ls: AccelmigrateServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    uri = params.text_document.uri
    target = target_of(ls, uri)
    if target is None:
        return []
    checked = await ls.checked(target)
    wanted = params.context.only
    actions: list[types.CodeAction] = []
    if _wanted(types.CodeActionKind.QuickFix, wanted):
        current = diagnostics_of(ls, target, checked).get(uri, [])
        asked = {(d.code, d.range.start.line) for d in params.context.diagnostics if d.source == SOURCE}
        chosen = [d for d in current if (d.code, d.range.start.line) in asked or _overlaps(d.range, params.range)]
        fixing = [d for d in chosen if (d.data or {}).get("fixable")]
        for word in dict.fromkeys(d.data["word"] for d in fixing):
            action = await _replacing(ls, target, word, f"apply `{word}` to this file", types.CodeActionKind.QuickFix)
            if action is not None:
                action.diagnostics = [d for d in fixing if d.data["word"] == word]
                action.is_preferred = True
                actions.append(action)
        actions += _skipping(ls, uri, [d for d in chosen if d.code and d.severity == types.DiagnosticSeverity.Warning])
    if _wanted(FIX_ALL, wanted):
        action = await _replacing(ls, target, None, FIX_ALL_TITLE, FIX_ALL)
        if action is not None:
            actions.append(action)
    return actions


def _versioned(ls: AccelmigrateServer) -> bool:
    """Whether the client takes `documentChanges` (edits that name a document version)."""
    workspace = ls.client_capabilities.workspace
    return bool(workspace and workspace.workspace_edit and workspace.workspace_edit.document_changes)


def _version_of(ls: AccelmigrateServer, uri: str) -> Optional[int]:
    return ls.workspace.get_text_document(uri).version


async def _replacing(ls: AccelmigrateServer, target: Target, words: Optional[str], title: str, kind) -> Optional[types.CodeAction]:
    """An action whose edits make the document what `apply --to WORDS` writes
    (the lines that change, in each cell that changes), for the version it
    was computed from; None when that changes nothing."""
    versions = {uri: _version_of(ls, uri) for uri in (target.cells or (target.uri,))}
    result = await asyncio.get_running_loop().run_in_executor(
        ls.checker, ls.documents.migrated, target.uri, target.path, target.text, words, ls.overrides
    )
    if result.error is not None or result.migrated is None or result.migrated == target.text:
        return None
    codec = ls.workspace.position_codec
    if target.cells is None:
        changes = {target.uri: minimal_edits(target.text, result.migrated, codec)}
    else:
        changes = {
            uri: minimal_edits(old, new, codec)
            for uri, old, new in zip(target.cells, target.cell_sources, cell_texts(result.migrated))
            if new != old
        }
    return types.CodeAction(title=title, kind=kind, edit=workspace_edit(changes, versions, _versioned(ls)))


def _skipping(ls: AccelmigrateServer, uri: str, diagnostics: list[types.Diagnostic]) -> list[types.CodeAction]:
    """"skip CODE on this line": the project's mark, written at the line's end."""
    text = ls.workspace.get_text_document(uri).source
    actions = []
    for found in diagnostics:
        edit = skip_mark_edit(text, found.range.start.line, str(found.code), ls.workspace.position_codec)
        if edit is not None:
            actions.append(types.CodeAction(
                title=f"accelmigrate: skip {found.code} on this line", kind=types.CodeActionKind.QuickFix, diagnostics=[found],
                edit=workspace_edit({uri: [edit]}, {uri: _version_of(ls, uri)}, _versioned(ls)),
            ))
    return actions


def _wanted(kind, only) -> bool:
    """Whether the client asked for KIND: no `only`, or a kind that KIND is (`source` covers `source.fixAll...`)."""
    kind = getattr(kind, "value", kind)
    return not only or any(kind == k or kind.startswith(f"{k}.") for k in (getattr(k, "value", k) for k in only))


def _overlaps(a: types.Range, b: types.Range) -> bool:
    key = lambda p: (p.line, p.character)  # noqa: E731
    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


@server.feature(types.TEXT_DOCUMENT_HOVER)
async def hover(ls: AccelmigrateServer, params: types.HoverParams) -> Optional[types.Hover]:
    """The `explain` entry of each finding on the hovered line."""
    target = target_of(ls, params.text_document.uri)
    if target is None:
        return None
    found = diagnostics_of(ls, target, await ls.checked(target)).get(params.text_document.uri, [])
    here = {d.code: d for d in found if d.code and d.range.start.line <= params.position.line <= d.range.end.line}
    if not here:
        return None
    entries = [explanation(str(code), (d.data or {}).get("word", "").split("=", 1)[0]) for code, d in here.items()]
    return types.Hover(types.MarkupContent(types.MarkupKind.Markdown, "\n\n---\n\n".join(f"```text\n{e}\n```" for e in entries)))


@server.feature(STATUS)
def status(ls: AccelmigrateServer, params=None) -> dict:
    return {"pid": os.getpid(), "checks_run": ls.documents.checks_run, "torch_imported": "torch" in sys.modules}
