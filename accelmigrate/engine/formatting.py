"""Keeping black-formatted files black-formatted, and making what the codemods
wrote fit every other file.

A file that black formats as it stands is formatted whole after migration. In
any other file only the statements that a codemod inserted or rewrote are
touched: one with a line longer than the project's line length, or whose
continuation lines were aligned to a bracket that moved, is formatted as
black would format it (keeping the file's quotes), at its indentation.
Everything else stays byte for byte. New imports are placed as isort and
ruff's `I` rules place them (`import_order`).
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import textwrap
import tokenize
from typing import Mapping, Optional

DEFAULT_LINE_LENGTH = 88
# Compound statements whose one-line header may be long after a rewrite
# (`with torch.autocast(...):`, `for batch in DataLoader(...):`).
_HEADED = (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith)
_BODY_FOR_A_HEADER = "    pass\n"
# Statements that hold statements without a `body` (each of those is a span of its own).
_HOLDS_STATEMENTS = tuple(getattr(ast, name) for name in ("Match",) if hasattr(ast, name))


# The oldest Python a project that names none is taken to run on: ruff's
# default target, and the oldest Python current torch supports. It lets black
# write what ruff writes (a long `with a, b(...):` in parentheses), so that a
# file passing `ruff format --check` passes it after migration too.
DEFAULT_PYTHON = "py39"


def _mode(black_config: Mapping, *, line_length: Optional[int] = None, keep_quotes: bool = False):
    import black  # imported only when a changed file needs it

    return black.Mode(
        target_versions=_target_versions(black, configured_targets(black_config).get("target-version")),
        line_length=line_length if line_length is not None else configured_line_length(black_config),
        string_normalization=not (keep_quotes or black_config.get("skip-string-normalization", False)),
        magic_trailing_comma=not black_config.get("skip-magic-trailing-comma", False),
    )


def configured_targets(black_config: Mapping) -> dict:
    """`{"target-version": [...]}` where BLACK_CONFIG sets it (black reads
    `target-version` and `target_version` alike), else empty."""
    for key in ("target-version", "target_version"):
        if key in black_config:
            return {"target-version": black_config[key]}
    return {}


def _target_versions(black, names) -> set:
    """black's TargetVersions for `target-version` names (`py38`), the
    default's when none is known."""
    names = [names] if isinstance(names, str) else list(names or [])
    known = {version.name.lower(): version for version in black.TargetVersion}
    targets = {known[name.lower()] for name in names if isinstance(name, str) and name.lower() in known}
    return targets or {known[DEFAULT_PYTHON]}


def project_python(data: Mapping) -> Optional[list[str]]:
    """The Pythons a pyproject.toml (its parsed DATA) says the project runs
    on, as black's `target-version` names them: black's own setting, else
    ruff's `target-version`, else `project.requires-python` read as black
    reads it; None when it says nothing."""
    tool = data.get("tool") if isinstance(data.get("tool"), Mapping) else {}
    for section in ("black", "ruff"):
        table = tool.get(section)
        targets = configured_targets(table).get("target-version") if isinstance(table, Mapping) else None
        if isinstance(targets, (str, list)):
            return [targets] if isinstance(targets, str) else list(targets)
    from black.files import infer_target_version

    try:
        inferred = infer_target_version(data)
    except Exception:  # a requires-python black cannot read: as if none were given
        return None
    return [version.name.lower() for version in inferred] if inferred else None


def configured_line_length(black_config: Mapping) -> int:
    """`[tool.black] line-length`, else black's and ruff's default."""
    return int(black_config.get("line-length", black_config.get("line_length", DEFAULT_LINE_LENGTH)))


def project_line_length(tool: Mapping) -> Optional[int]:
    """The line length a project configures in pyproject.toml's `[tool]` table:
    black's, else ruff's; None when neither sets one."""
    for section in ("black", "ruff"):
        table = tool.get(section)
        if isinstance(table, Mapping):
            for key in ("line-length", "line_length"):
                if isinstance(table.get(key), int) and not isinstance(table.get(key), bool):
                    return table[key]
    return None


# Above this size a file is generated code or a data table (a 1 MB list on
# one line): black over it takes tens of seconds, to say what its long lines
# already say, so its changed statements are fitted instead.
BLACK_CHECK_LIMIT = 256 * 1024


def parenthesized_long_tuples(original: str, migrated: str, line_length: int) -> str:
    """MIGRATED with the tuple on the right of each inserted or rewritten
    assignment (`x, y = x.to(device), y.to(device)`) put in parentheses
    where its line is too long: black then splits it one item a line, as
    ruff's formatter does (black alone would split inside the first call),
    and both formatters keep those parentheses."""
    changed = _changed_lines(original, migrated)
    try:
        tree = ast.parse(migrated)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return migrated
    lines = _lines_with_ends(migrated)
    values = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return))
        and isinstance(node.value, ast.Tuple)
        and node.value.elts
        and node.lineno == node.end_lineno
        and node.lineno in changed
        and _width(lines[node.lineno - 1]) > line_length
    ]
    for value in sorted(values, key=lambda v: (v.lineno, v.col_offset), reverse=True):
        line = lines[value.lineno - 1].encode("utf-8")
        if line[value.col_offset : value.col_offset + 1] == b"(" and line[value.end_col_offset - 1 : value.end_col_offset] == b")":
            continue  # already in parentheses (or one element's own: `(a), (b)` is left as written)
        wrapped = line[: value.col_offset] + b"(" + line[value.col_offset : value.end_col_offset] + b")" + line[value.end_col_offset :]
        lines[value.lineno - 1] = wrapped.decode("utf-8")
    return "".join(lines)


def is_black_formatted(source: str, black_config: Mapping) -> bool:
    if len(source) > BLACK_CHECK_LIMIT:
        return False
    import black

    try:
        black.format_file_contents(source, fast=True, mode=_mode(black_config))
    except black.NothingChanged:
        return True
    except Exception:  # black cannot format it (e.g. syntax it does not know)
        return False
    return False


def black_format(source: str, black_config: Mapping) -> str:
    import black

    try:
        return black.format_file_contents(source, fast=False, mode=_mode(black_config))
    except black.NothingChanged:
        return source


# -- inserted and rewritten statements in files black does not format -----------------------


def fit_changed_statements(original: str, migrated: str, line_length: int, black_config: Mapping = {}) -> str:
    """MIGRATED with each statement that holds an inserted or rewritten line
    formatted as black would, when that line is longer than LINE_LENGTH or its
    continuation lost the bracket it was aligned to; every other line as it is.
    A statement black cannot format alone, or that holds a string spanning
    lines (re-indenting would change its value), is left as written."""
    lines = _lines_with_ends(migrated)
    changed = _changed_lines(original, migrated)
    if not changed:
        return migrated
    try:
        tree = ast.parse(migrated)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return migrated
    lines = _wrapped_comments(lines, changed, line_length, tree)  # one item a line still: the spans below hold
    spans = sorted(_statement_spans(tree, lines), reverse=True)
    for first, last, is_header in spans:
        span = range(first, last + 1)
        if changed.isdisjoint(span):
            continue
        text = "".join(lines[first - 1 : last])
        too_long = any(_width(lines[n - 1]) > line_length for n in span if n in changed)
        if not (too_long or _lost_alignment(text, [n in changed for n in span])):
            continue
        formatted = _black_statement(text, line_length, is_header, black_config)
        if formatted is not None and formatted != text:
            lines[first - 1 : last] = [formatted]
    fitted = "".join(lines)
    try:
        ast.parse(fitted)
    except SyntaxError:  # never: each statement was checked; kept as a guard
        return migrated
    return fitted


def _wrapped_comments(lines: list[str], changed: set[int], line_length: int, tree: ast.Module) -> list[str]:
    """LINES with each inserted comment line that is too long broken at spaces
    into comment lines of the same indentation (black leaves comments alone;
    a codemod's own explanation may be long at a deep indentation). A wrapped
    line stays one item of the list, so line numbers still index it."""
    inside_strings = _lines_inside_strings(tree)
    wrapped = list(lines)
    for number in sorted(changed, reverse=True):
        if number > len(lines) or number in inside_strings:
            continue
        line = lines[number - 1]
        stripped = line.strip()
        if not stripped.startswith("#") or _width(line) <= line_length:
            continue
        indent = line[: len(line) - len(line.lstrip())]
        newline = line[len(line.rstrip("\r\n")) :]
        prefix = indent + "# "
        pieces = textwrap.wrap(stripped.lstrip("#").strip(), width=max(20, line_length - len(prefix)), break_long_words=False)
        if len(pieces) > 1:
            wrapped[number - 1] = "".join(prefix + piece + (newline or "\n") for piece in pieces)
            if not newline:
                wrapped[number - 1] = wrapped[number - 1][:-1]
    return wrapped


def _lines_inside_strings(tree: ast.Module) -> set[int]:
    """Lines that continue a string spanning lines (a `#` there is text)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        spans_lines = isinstance(node, (ast.Constant, ast.JoinedStr)) and (node.end_lineno or 0) > node.lineno
        if spans_lines:
            inside.update(range(node.lineno + 1, node.end_lineno + 1))
    return inside


# Where Python's tokenizer ends a line: "\r\n", "\n", and a lone "\r" too (not form feeds or the
# other breaks str.splitlines knows).
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _lines_with_ends(text: str) -> list[str]:
    """Lines as Python numbers them, each with its end."""
    return _LINE.findall(text)


def _width(line: str) -> int:
    return len(line.rstrip("\r\n"))


def _changed_lines(original: str, migrated: str) -> set[int]:
    """The lines of MIGRATED (1-based) that a codemod inserted or rewrote; a
    line that was only re-indented (moved under a new block) is not one."""
    before = [line.strip() for line in _lines_with_ends(original)]
    after = [line.strip() for line in _lines_with_ends(migrated)]
    changed: set[int] = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes():
        if tag != "equal":
            changed.update(range(j1 + 1, j2 + 1))
    return changed


def _statement_spans(tree: ast.Module, lines: list[str]) -> list[tuple[int, int, bool]]:
    """(first line, last line, is a compound statement's header) of each
    simple statement alone on its lines, and of each one-line header."""
    spans = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        if isinstance(node, _HEADED):
            if node.body[0].lineno > node.lineno and _is_whole_header(lines[node.lineno - 1]):
                spans.append((node.lineno, node.lineno, True))
        elif not hasattr(node, "body") and not isinstance(node, _HOLDS_STATEMENTS) and _alone_on_its_lines(node, lines):
            spans.append((node.lineno, node.end_lineno, False))
    return spans


def _is_whole_header(line: str) -> bool:
    """`for ... :` complete on this line (an `elif`, or a header continued on
    the next lines, is not)."""
    try:
        ast.parse(line.strip() + "\n" + _BODY_FOR_A_HEADER)
    except SyntaxError:
        return False
    return True


def _alone_on_its_lines(node: ast.stmt, lines: list[str]) -> bool:
    """Nothing but indentation before it, nothing but a comment after it (no `;`)."""
    first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
    before = first.encode("utf-8")[: node.col_offset].decode("utf-8", "replace")
    after = last.encode("utf-8")[node.end_col_offset :].decode("utf-8", "replace").strip()
    return not before.strip() and (not after or after.startswith("#"))


def _black_statement(text: str, line_length: int, is_header: bool, black_config: Mapping) -> Optional[str]:
    """TEXT (one statement, or a header) formatted by black at its own
    indentation, for the project's Pythons (BLACK_CONFIG's target-version)."""
    import black

    first = text.split("\n", 1)[0]
    indent = first[: len(first) - len(first.lstrip())]
    newline = "\r\n" if first.endswith("\r") else "\n"
    body = text[len(indent) :].replace("\r\n", "\n")
    if not body.endswith("\n"):
        body += "\n"
    if _spans_a_string(body):
        return None
    source = body + _BODY_FOR_A_HEADER if is_header else body
    try:
        mode = _mode(configured_targets(black_config), line_length=max(1, line_length - len(indent.expandtabs(4))), keep_quotes=True)
        formatted = black.format_str(source, mode=mode)
        if ast.dump(ast.parse(formatted)) != ast.dump(ast.parse(source)):
            return None
    except Exception:  # black or ast cannot take the statement alone: leave it as written
        return None
    if is_header:
        formatted = formatted[: -len(_BODY_FOR_A_HEADER)] if formatted.endswith(_BODY_FOR_A_HEADER) else None
        if formatted is None:
            return None
    out = "".join(indent + line + newline if line else newline for line in formatted[:-1].split("\n"))
    return out if text.endswith(("\n", "\r\n")) else out[: -len(newline)]


def _spans_a_string(source: str) -> bool:
    try:
        return any(
            token.type == tokenize.STRING and token.start[0] != token.end[0]
            for token in tokenize.generate_tokens(io.StringIO(source).readline)
        )
    except (tokenize.TokenError, SyntaxError):
        return True


def _lost_alignment(text: str, changed: list[bool]) -> bool:
    """Whether a continuation line of this statement, unchanged, is no longer
    aligned with the bracket it follows on a rewritten line (`f(a,` / `  b)`
    after `f` became a longer name)."""
    if len(changed) < 2:
        return False
    open_brackets: list[tuple[int, int, bool]] = []  # (row, column after it, content follows on its row)
    row_started: set[int] = set()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text.replace("\r\n", "\n")).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    for token in tokens:
        if token.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            continue
        row, column = token.start
        if open_brackets and open_brackets[-1][0] == row and not open_brackets[-1][2]:
            open_brackets[-1] = (*open_brackets[-1][:2], True)
        if row not in row_started:
            row_started.add(row)
            if row > 1 and open_brackets and token.string not in ")]}":
                opened_row, after, visual = open_brackets[-1]
                if visual and changed[opened_row - 1] and not changed[row - 1] and column != after:
                    return True
        if token.string in "([{" and token.type == tokenize.OP:
            open_brackets.append((row, token.end[1], False))
        elif token.string in ")]}" and token.type == tokenize.OP and open_brackets:
            open_brackets.pop()
    return False
