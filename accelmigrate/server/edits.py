"""The edits of the language server's code actions: the fewest lines that
turn the buffer into what `apply` writes (a diff of the two texts, line by
line, as LSP counts lines), each action for the document version it was
computed from, so that an editor refuses it once the user has typed on;
and the "skip this line" action's mark."""

from __future__ import annotations

import difflib
import re
from typing import Optional

from lsprotocol import types
from pygls.workspace import PositionCodec

from accelmigrate.server.diagnostics import Positions, lines_of

# `# accelmigrate: skip[AM101, AM201]` at the end of a line, to add a code to.
_MARK = re.compile(r"#\s*accelmigrate:\s*skip\[(?P<codes>[^\]]*)\]")


def minimal_edits(old: str, new: str, codec: PositionCodec) -> list[types.TextEdit]:
    """TextEdits that make OLD into NEW, touching only the lines that differ."""
    old_lines, new_lines = lines_of(old), lines_of(new)
    positions = Positions(old, codec)
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    return [
        types.TextEdit(types.Range(positions.line_start(i1), positions.line_start(i2)), "".join(new_lines[j1:j2]))
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def workspace_edit(changes: dict[str, list[types.TextEdit]], versions: dict[str, Optional[int]], versioned: bool) -> types.WorkspaceEdit:
    """The edits of each document, as `documentChanges` naming the version
    they were computed for where the client takes them (`versioned`), else
    as plain `changes`."""
    if not versioned:
        return types.WorkspaceEdit(changes=changes)
    return types.WorkspaceEdit(
        document_changes=[
            types.TextDocumentEdit(types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=versions.get(uri)), edits)
            for uri, edits in changes.items()
        ]
    )


def skip_mark_edit(text: str, line: int, code: str, codec: PositionCodec) -> Optional[types.TextEdit]:
    """The edit that silences CODE on 0-based LINE: the code added to the
    line's own `skip[...]` mark, else a new mark at the line's end; None on a
    line a comment cannot end (one continued by a backslash)."""
    lines = lines_of(text)
    if line >= len(lines):
        return None
    content = lines[line].rstrip("\r\n")
    if content.endswith("\\"):
        return None
    positions = Positions(text, codec)
    mark = _MARK.search(content)
    if mark is not None:
        codes = [c.strip() for c in re.split(r"[\s,]+", mark.group("codes")) if c.strip()]
        if code in codes:
            return None
        place = types.Range(positions.at(line, mark.start("codes")), positions.at(line, mark.end("codes")))
        return types.TextEdit(place, ", ".join([*codes, code]))
    end = positions.at(line, len(content))
    return types.TextEdit(types.Range(end, end), f"  # accelmigrate: skip[{code}]")
