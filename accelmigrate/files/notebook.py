"""Jupyter notebooks (.ipynb, nbformat 4): their code cells as one Python
source for the codemods, and a migrated source put back into the cells.

    notebook = read_notebook(path)              # or parse_notebook(text)
    migrated = migrate(notebook.source)         # plain Python: the codemods' input
    new_text = notebook.with_source(migrated)   # the notebook's JSON text

The source holds the code cells in order, each after a marker comment
(`# %% [accelmigrate cell N]`, N its index in the notebook's `cells`), so a
migrated source splits back into its cells; what a codemod inserts before
the first marker (new imports at the top) belongs to the first code cell.
IPython's own syntax is no Python: a line magic (`%matplotlib inline`), a
shell line (`!pip install ...`, `files = !ls`), help (`obj?`) and a whole
cell under a cell magic (`%%bash`) become an inert placeholder
line (`...`) with the same indentation, so every line keeps its number and
no codemod touches them; going back, each placeholder becomes its original
line again. Under `%%time`, `%%capture` and `%%prun` the cell is the
notebook's own Python (often its training loop): only the magic's line is
a placeholder, and it stays the cell's first line.

Only the `source` of the cells that changed is rewritten, in the JSON text
itself: outputs, metadata, nbformat, the order of keys, the indentation and
the escapes of every other byte stay as they were, and a notebook with
nothing changed comes back byte-identical. No dependency on nbformat.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import re
import tokenize
from pathlib import Path
from typing import Iterable, Iterator, Optional, Union

from accelmigrate.codemods import Finding

CELL_MARKER = "# %% [accelmigrate cell {index}]"
_CELL_MARKER_LINE = re.compile(r"# %% \[accelmigrate cell (\d+)\]\r?\n?")
PLACEHOLDER = "...  # IPython syntax, kept as written"
# IPython's escapes at the start of a line: shell, magic, help, auto-call.
_IPYTHON_STARTS = ("!", "%", "?", "/", ";", ",")
# `name = !command`, `a, b = %magic ...`: IPython assigns a magic's output.
_ASSIGNED_IPYTHON = re.compile(r"\s*[A-Za-z_][\w.]*(\s*,\s*[A-Za-z_][\w.]*)*\s*=\s*[!%]")
# Cell magics that run the rest of the cell as the notebook's own Python, in its namespace (a training loop under
# `%%time` trains the notebook's model): only their first line is IPython's. Any other cell magic's cell is its input.
PYTHON_CELL_MAGICS = frozenset({"time", "capture", "prun"})
_JSON = json.JSONDecoder()
_JSON_SPACE = re.compile(r"[ \t\n\r]*")

Source = Union[str, list]  # a cell's `source`: one string, or a list of lines


NOTEBOOK_SUFFIX = ".ipynb"


def is_notebook(path: str) -> bool:
    return path.endswith(NOTEBOOK_SUFFIX)


@dataclasses.dataclass(frozen=True, order=True)
class CellFinding(Finding):
    """A finding in a notebook: `line` counts from the first line of its cell."""

    cell: int = 1  # 1-based, counting every cell (markdown too) as Jupyter shows them top to bottom


def finding_position(finding: Finding) -> str:
    """`cell N:LINE:COL` in a notebook, `LINE:COL` in a script."""
    cell = getattr(finding, "cell", None)
    return f"{'' if cell is None else f'cell {cell}:'}{finding.line}:{finding.column}"


class NotebookError(ValueError):
    """Not a notebook this module can read, or a migration that cannot go back into its cells."""


@dataclasses.dataclass(frozen=True)
class CodeCell:
    index: int  # in the notebook's `cells`
    text: str  # the cell's source as Jupyter shows it
    first_line: int  # where the cell's first line is in the notebook's Python source (1-based)
    line_count: int
    ipython_lines: tuple[str, ...]  # the lines replaced by placeholders, in order
    newline_added: bool  # the cell's last line had no newline; the source gives it one
    span: tuple[int, int]  # where its `source` value lies in the JSON text
    raw_lines: tuple[tuple[int, int], ...]  # each element of a list-valued `source` in the JSON text


@dataclasses.dataclass(frozen=True)
class Notebook:
    text: str  # the JSON text as read
    source: str  # the code cells as one Python source
    cells: tuple[CodeCell, ...]
    is_python: bool  # False for another kernel's language: nothing to migrate
    # The cells that do not parse, (their CodeCell, why): left as written, each
    # line a placeholder, while the codemods migrate the others.
    unparsed: tuple[tuple[CodeCell, str], ...] = ()

    def cell_position(self, line: int) -> tuple[int, int]:
        """A line of `source` (1-based) as (index in `cells`, line in the cell, 1-based);
        a marker line counts as its cell's first line."""
        for cell in reversed(self.cells):
            if line >= cell.first_line - 1:
                return cell.index, max(1, line - cell.first_line + 1)
        raise NotebookError(f"line {line} is in no code cell")

    def in_cells(self, findings: Iterable[Finding]) -> list[CellFinding]:
        """Findings positioned in `source`, placed in their cells."""
        placed = []
        for finding in findings:
            index, line = self.cell_position(finding.line)
            placed.append(CellFinding(**dataclasses.asdict(finding) | {"line": line, "cell": index + 1}))
        return placed

    def with_source(self, migrated: str) -> str:
        """The notebook's JSON text with MIGRATED (this notebook's `source`,
        changed) put back into its cells; the text as read when nothing changed."""
        if migrated == self.source:
            return self.text
        pieces, position = [], 0
        for cell, new_text in zip(self.cells, _split_cells(migrated, self.cells)):
            if new_text == cell.text:
                continue
            start, end = cell.span
            pieces += [self.text[position:start], _encode_source(self.text, cell, new_text)]
            position = end
        return "".join(pieces) + self.text[position:]


def read_notebook(path: Path) -> Notebook:
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NotebookError(f"{path}: not UTF-8 (byte offset {error.start}); a notebook is UTF-8 JSON") from None
    return parse_notebook(text, str(path))


def parse_notebook(text: str, name: str = "<notebook>") -> Notebook:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise NotebookError(f"{name}:{error.lineno}: not JSON: {error.msg}") from None
    except RecursionError:  # valid JSON, but deeper than Python's reader goes (no notebook is)
        raise NotebookError(f"{name}: not JSON: nested too deeply to be read") from None
    if not isinstance(document, dict) or document.get("nbformat") != 4 or not isinstance(document.get("cells"), list):
        raise NotebookError(f"{name}: not an nbformat 4 notebook (a JSON object with nbformat 4 and a list of cells)")
    if not _is_python(document.get("metadata")):
        return Notebook(text, "", (), is_python=False)
    cells, parts, line, unparsed = [], [], 1, []
    for index, span, raw_lines, value in _code_cell_sources(text):
        cell_text = "".join(value) if isinstance(value, list) else value
        python, ipython_lines = _as_python(cell_text)
        problem = _cell_problem(python)
        if problem is not None:  # kept as written, out of the codemods' sight
            ipython_lines = cell_text.splitlines(keepends=True)
            python = "".join(PLACEHOLDER + _newline_of(each) for each in ipython_lines)
        newline_added = bool(python) and not python.endswith("\n")
        python += "\n" if newline_added else ""
        parts += [CELL_MARKER.format(index=index) + "\n", python]
        count = python.count("\n")
        cells.append(
            CodeCell(index, cell_text, line + 1, count, tuple(ipython_lines), newline_added, span, tuple(raw_lines))
        )
        if problem is not None:
            unparsed.append((cells[-1], problem))
        line += 1 + count
    return Notebook(text, "".join(parts), tuple(cells), is_python=True, unparsed=tuple(unparsed))


def _cell_problem(python: str) -> Optional[str]:
    """Why the cell does not parse on its own, or None. Jupyter runs each
    cell on its own, so each must parse on its own: a block or a bracket
    that a later cell completes parses only when the cells are joined, and
    fails in Jupyter."""
    try:
        ast.parse(python)
    except SyntaxError as error:
        position = f"{error.lineno}:{error.offset}" if error.offset else f"{error.lineno}"
        return f"{position}: syntax error: {error.msg} (each cell must parse on its own)"
    except (RecursionError, MemoryError):
        return "nested too deeply for Python's own parser"
    except ValueError as error:  # a NUL character
        return str(error)
    return None


def _is_python(metadata) -> bool:
    """A notebook says its language in kernelspec or language_info; one that says none is taken for Python."""
    if not isinstance(metadata, dict):
        return True
    for key, field in (("kernelspec", "language"), ("language_info", "name")):
        section = metadata.get(key)
        if isinstance(section, dict) and isinstance(section.get(field), str):
            return section[field].lower().startswith("python")
    return True


# --- IPython syntax ------------------------------------------------------------------------


def _as_python(cell_text: str) -> tuple[str, list[str]]:
    """The cell with each IPython line replaced by a placeholder; the lines replaced."""
    lines = cell_text.splitlines(keepends=True)
    if lines and lines[0].startswith("%%"):  # a cell magic
        magic = PLACEHOLDER + _newline_of(lines[0])
        if _cell_magic(lines[0]) not in PYTHON_CELL_MAGICS:  # the whole cell is the magic's input
            return "".join(PLACEHOLDER + _newline_of(line) for line in lines), lines
        python, replaced = _line_magics_replaced(lines[1:])
        return magic + python, [lines[0], *replaced]
    return _line_magics_replaced(lines)


def _cell_magic(first_line: str) -> str:
    """`time` for `%%time`, `capture` for `%%capture output --no-stderr`."""
    return first_line[2:].split(maxsplit=1)[0] if first_line[2:].strip() else ""


def _line_magics_replaced(lines: list[str]) -> tuple[str, list[str]]:
    kept, replaced = [], []
    for line in lines:
        if _looks_like_ipython(line) and _at_statement_start("".join(kept)):
            indent = line[: len(line) - len(line.lstrip())]
            kept.append(indent + PLACEHOLDER + _newline_of(line))
            replaced.append(line)
        else:
            kept.append(line)
    return "".join(kept), replaced


def _looks_like_ipython(line: str) -> bool:
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return False
    if stripped.startswith(_IPYTHON_STARTS) or _ASSIGNED_IPYTHON.match(line):
        return True
    return stripped.endswith("?") and "#" not in stripped  # `model.forward?`


def _at_statement_start(prefix: str) -> bool:
    """Whether the line after PREFIX starts a statement, as IPython decides:
    a `%` or `!` inside brackets or a string, or after a backslash, is Python's."""
    try:
        for _ in tokenize.generate_tokens(io.StringIO(prefix).readline):
            pass
    except tokenize.TokenError:  # EOF inside a bracket, a string or a continued line
        return False
    except SyntaxError:  # an indentation error: Python will say so; the line itself starts anew
        return True
    return True


def _newline_of(line: str) -> str:
    return line[len(line.rstrip("\r\n")) :]


# --- back into the cells -----------------------------------------------------------------


def cell_marker_lines(source: str) -> list[tuple[int, int]]:
    """(line, 1-based; the cell's index in `cells`) of each cell marker in a joint source."""
    return [
        (number, int(match.group(1)))
        for number, line in enumerate(source.splitlines(keepends=True), 1)
        if (match := _CELL_MARKER_LINE.fullmatch(line))
    ]


def _split_cells(migrated: str, cells: tuple[CodeCell, ...]) -> list[str]:
    """MIGRATED cut at the cell markers into each cell's new text, IPython lines restored."""
    lines = migrated.splitlines(keepends=True)
    markers = [number for number, line in enumerate(lines) if _CELL_MARKER_LINE.fullmatch(line)]
    found = [int(_CELL_MARKER_LINE.fullmatch(lines[number]).group(1)) for number in markers]
    if found != [cell.index for cell in cells]:
        raise NotebookError(
            "the migration moved code across notebook cells (a cell marker moved or vanished); notebook left unchanged"
        )
    ends = [*markers[1:], len(lines)]
    texts = []
    for position, cell in enumerate(cells):
        body = lines[markers[position] + 1 : ends[position]]
        if position == 0:  # what a codemod put before the first marker (imports) opens the first cell
            body = lines[: markers[0]] + body
        if not _opens_blank(cell.text):  # the blank lines after a line the migration removed (an import)
            while body and _opens_blank(body[0]):
                body = body[1:]
        texts.append(_restore_ipython("".join(body), cell))
    return texts


def _opens_blank(text: str) -> bool:
    """The text's first line is blank (an empty cell opens with none)."""
    return bool(text) and not text.splitlines()[0].strip()


def _restore_ipython(text: str, cell: CodeCell) -> str:
    lines = text.splitlines(keepends=True)
    placeholders = [number for number, line in enumerate(lines) if line.strip() == PLACEHOLDER]
    if len(placeholders) != len(cell.ipython_lines):
        raise NotebookError(
            f"cell {cell.index}: the migration changed the cell's IPython lines; notebook left unchanged"
        )
    for number, original in zip(placeholders, cell.ipython_lines):
        lines[number] = original
    if cell.text.startswith("%%") and placeholders and placeholders[0] > 0:
        # Code the migration put at the top of a `%%time` cell goes under the magic, which must open the cell.
        lines.insert(0, lines.pop(placeholders[0]))
    restored = "".join(lines)
    if cell.newline_added and restored.endswith("\n"):
        restored = restored[:-1]
    return restored


def _encode_source(json_text: str, cell: CodeCell, new_text: str) -> str:
    """NEW_TEXT as this cell's `source` value, in the notebook's own style: a
    list of lines laid out as the old one was (an unchanged line keeps its
    exact escapes), or one string."""
    start, end = cell.span
    ensure_ascii = json_text.isascii() and "\\u" in json_text
    if json_text[start] == '"':
        return json.dumps(new_text, ensure_ascii=ensure_ascii)
    old_tokens = {json.loads(json_text[a:b]): json_text[a:b] for a, b in cell.raw_lines}
    tokens = [old_tokens.get(line) or json.dumps(line, ensure_ascii=ensure_ascii) for line in _lines(new_text)]
    if not tokens:
        return "[]"
    opening, separator, closing = _list_layout(json_text, cell)
    return "[" + opening + separator.join(tokens) + closing + "]"


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _list_layout(json_text: str, cell: CodeCell) -> tuple[str, str, str]:
    """The whitespace after `[`, between elements and before `]` of the old list."""
    start, end = cell.span
    elements = cell.raw_lines
    if elements:
        opening = json_text[start + 1 : elements[0][0]]
        closing = json_text[elements[-1][1] : end - 1]
        if len(elements) > 1:
            return opening, json_text[elements[0][1] : elements[1][0]], closing
        return opening, "," + opening, closing
    line = json_text[json_text.rfind("\n", 0, start) + 1 : start]
    key_indent = line[: len(line) - len(line.lstrip(" \t"))]
    newline = "\r\n" if "\r\n" in json_text else "\n"
    opening = newline + key_indent + _indent_unit(json_text)
    return opening, "," + opening, newline + key_indent


def _indent_unit(json_text: str) -> str:
    match = re.search(r"\n([ \t]+)\S", json_text)
    return match.group(1) if match else " "


# --- where the cells' sources lie in the JSON text -----------------------------------------------


def _code_cell_sources(text: str) -> Iterator[tuple[int, tuple[int, int], list[tuple[int, int]], Source]]:
    """For each code cell: its index, the span of its `source` value, the spans
    of that value's elements (when a list) and the value."""
    start = 1 if text.startswith("\ufeff") else 0
    for key, cells_start, _ in _members(text, _skip_space(text, start)):
        if key != "cells":
            continue
        for index, (cell_start, _) in enumerate(_elements(text, cells_start)):
            members = {key: (a, b) for key, a, b in _members(text, cell_start)}
            cell_type = _value(text, members.get("cell_type"))
            if not isinstance(cell_type, str):  # nbformat 4 requires it: a cell of unknown kind is never skipped unseen
                raise NotebookError(f"cell {index + 1}: no `cell_type` (code, markdown or raw): not an nbformat 4 cell")
            if cell_type != "code" or "source" not in members:
                continue
            span = members["source"]
            value = _value(text, span)
            raw_lines = list(_elements(text, span[0])) if isinstance(value, list) else []
            if isinstance(value, list) and not all(isinstance(line, str) for line in value):
                raise NotebookError(f"cell {index + 1}: `source` is not text")
            if not isinstance(value, (str, list)):
                raise NotebookError(f"cell {index + 1}: `source` is not text")
            yield index, span, raw_lines, value


def _value(text: str, span: Optional[tuple[int, int]]):
    return None if span is None else json.loads(text[span[0] : span[1]])


def _members(text: str, position: int) -> Iterator[tuple[str, int, int]]:
    """(key, start, end) of each member of the JSON object at POSITION."""
    if text[position] != "{":
        raise NotebookError("expected a JSON object")
    position = _skip_space(text, position + 1)
    if text[position] == "}":
        return
    while True:
        key, position = _JSON.raw_decode(text, position)
        position = _skip_space(text, position)
        position = _skip_space(text, position + 1)  # the colon
        _, end = _JSON.raw_decode(text, position)
        yield key, position, end
        position = _skip_space(text, end)
        if text[position] == "}":
            return
        position = _skip_space(text, position + 1)  # the comma


def _elements(text: str, position: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each element of the JSON array at POSITION."""
    position = _skip_space(text, position + 1)
    if text[position] == "]":
        return
    while True:
        _, end = _JSON.raw_decode(text, position)
        yield position, end
        position = _skip_space(text, end)
        if text[position] == "]":
            return
        position = _skip_space(text, position + 1)


def _skip_space(text: str, position: int) -> int:
    return _JSON_SPACE.match(text, position).end()
