"""`check`'s findings as LSP diagnostics: their ranges in the client's
position units (UTF-16 by default), severities and messages, and a code's
`explain` entry for a hover."""

from __future__ import annotations

import bisect
import itertools
import re
from typing import Optional

from lsprotocol import types
from pygls.workspace import PositionCodec

from accelmigrate.files.notebook import NotebookError, is_notebook, parse_notebook
from accelmigrate.output import lint
from accelmigrate.output.explain import code_entry, entry_text
from accelmigrate.server.documents import Checked

SOURCE = "accelmigrate"
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")  # LSP's line ends, no others (not str.splitlines)
SEVERITIES = {lint.ERROR: types.DiagnosticSeverity.Error, lint.NOTE: types.DiagnosticSeverity.Information}


def lines_of(text: str) -> list[str]:
    return _LINE.findall(text)


class Positions:
    """Positions in one text, converted from code points to the client's units."""

    def __init__(self, text: str, codec: PositionCodec) -> None:
        self.text, self.lines, self.codec = text, lines_of(text), codec

    def at(self, line: int, column: int) -> types.Position:
        """A 0-based (line, code point) position."""
        if line >= len(self.lines):
            return types.Position(line=len(self.lines), character=0)
        column = min(column, len(self.lines[line].rstrip("\r\n")))
        return self.codec.position_to_client_units(self.lines, types.Position(line, column))

    def of_line(self, line: int, column: int) -> types.Range:
        """From (1-based) LINE:COLUMN to the end of that line's code."""
        end = len(self.lines[line - 1].rstrip()) if 0 < line <= len(self.lines) else 0
        return types.Range(self.at(line - 1, column - 1), self.at(line - 1, max(end, column - 1)))

    def of_offsets(self, start: int, end: int) -> types.Range:
        starts = list(itertools.accumulate((len(line) for line in self.lines), initial=0))

        def at(offset: int) -> types.Position:
            line = max(0, bisect.bisect_right(starts, offset) - 1)
            return self.at(line, offset - starts[line])

        return types.Range(at(start), at(end))

    def line_start(self, line: int) -> types.Position:
        """Where 0-based LINE starts; past the last line, the end of the text."""
        lines = self.lines
        if line < len(lines) or not lines or lines[-1].endswith(("\n", "\r")):
            return types.Position(line=min(line, len(lines)), character=0)
        return self.at(len(lines) - 1, len(lines[-1]))

    def whole(self) -> types.Range:
        return types.Range(types.Position(0, 0), self.line_start(len(self.lines)))


def diagnostic(checked: Checked, finding, place: types.Range, *, in_cell: bool = False) -> types.Diagnostic:
    """One finding; a notebook's JSON text says the cell in the message, a cell of a notebook document need not."""
    located = is_notebook(checked.path) and not in_cell
    return types.Diagnostic(
        place,
        lint.located_message(finding, checked.plan) if located else lint.check_message(finding, checked.plan),
        severity=SEVERITIES.get(lint.severity(finding), types.DiagnosticSeverity.Warning),
        code=finding.code,
        source=SOURCE,
        data={"word": lint.word_spec(finding.word, checked.plan), "fixable": finding.fixed},
    )


def error_diagnostic(message: str, place: types.Range) -> types.Diagnostic:
    return types.Diagnostic(place, message, severity=types.DiagnosticSeverity.Error, source=SOURCE)


def file_diagnostics(checked: Checked, codec: PositionCodec) -> list[types.Diagnostic]:
    """The diagnostics of a file's text (a notebook's: its JSON text)."""
    positions = Positions(checked.text, codec)
    if checked.error is not None:
        cell, line, column = checked.error_place()
        return [error_diagnostic(checked.error, positions.of_line(1, 1) if cell is not None else positions.of_line(line, column))]
    return [diagnostic(checked, f, _place(checked, f, positions)) for f in checked.findings]


def cell_diagnostics(checked: Checked, cells: list[str], codec: PositionCodec) -> list[list[types.Diagnostic]]:
    """The diagnostics of each cell of a notebook document (CELLS: their texts, in order)."""
    found: list[list[types.Diagnostic]] = [[] for _ in cells]
    if not cells:
        return found
    if checked.error is not None:
        cell, line, column = checked.error_place()
        index = cell - 1 if cell is not None and 0 < cell <= len(cells) else 0
        found[index].append(error_diagnostic(checked.error, Positions(cells[index], codec).of_line(line if cell else 1, column)))
        return found
    for finding in checked.findings:
        index = getattr(finding, "cell", 1) - 1
        if 0 <= index < len(cells):
            place = Positions(cells[index], codec).of_line(finding.line, finding.column)
            found[index].append(diagnostic(checked, finding, place, in_cell=True))
    return found


def _place(checked: Checked, finding, positions: Positions) -> types.Range:
    """A finding's line, or in a notebook's JSON text the element of the cell's `source` that holds it."""
    cell = getattr(finding, "cell", None)
    if cell is None:
        return positions.of_line(finding.line, finding.column)
    try:
        notebook = parse_notebook(checked.text, checked.path)
    except NotebookError:
        return positions.of_line(1, 1)
    for code_cell in notebook.cells:
        if code_cell.index == cell - 1:
            if 0 < finding.line <= len(code_cell.raw_lines):
                return positions.of_offsets(*code_cell.raw_lines[finding.line - 1])
            return positions.of_offsets(*code_cell.span)
    return positions.of_line(1, 1)


def explanation(code: str, word: Optional[str]) -> str:
    """The `explain` entry of CODE, as `accelmigrate explain CODE` prints it."""
    from accelmigrate.codemods import all_codemods
    from accelmigrate.engine.migrate import CODEMOD_FAILED, ENGINE_CODES

    if code == CODEMOD_FAILED:
        return entry_text(code_entry(None, code))
    cls = all_codemods().get(word or "")
    if cls is not None and code in cls.codes:
        return entry_text(code_entry(cls, code))
    return f"{code}  {ENGINE_CODES.get(code, '')}".rstrip()
