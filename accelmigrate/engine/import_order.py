"""New imports placed where isort and ruff's `I` rules would put them.

LibCST appends the imports a codemod needs after the file's last import, and
adds names at the end of an existing `from module import ...`. Here each new
import statement moves into its section of the file's leading import block
(future, standard library, third party, first party, relative: the order
isort and ruff use), at its sorted place there: plain `import` statements
before `from` ones, modules compared without case, or by module alone when the
file sorts them that way (isort's force_sort_within_sections). A section the
file does not have yet becomes a group of its own, between blank lines. The
names of a new `from` import, or one that gained names, are sorted as those
tools sort them: constants, classes, then the rest. A file whose imports were in that
order keeps passing `ruff check --select I` (and isort's `--check`).

First party is what isort and ruff find by default: a module or package of
that name in the project's root (the folder of the nearest pyproject.toml,
else the file's own folder) or in its `src/`; `accelmigrate` itself is third
party in the user's project, like torch.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

FUTURE, STANDARD_LIBRARY, THIRD_PARTY, FIRST_PARTY, RELATIVE = range(5)


@dataclasses.dataclass(frozen=True)
class _Import:
    node: ast.stmt
    first: int  # 0-based line indexes in the file, inclusive
    last: int
    section: int
    is_from: bool
    module: str


def place_new_imports(original: str, migrated: str, path: Optional[str] = None) -> str:
    """MIGRATED with the imports it has and ORIGINAL has not moved into their
    sections, and the names of new and grown `from` imports sorted; MIGRATED as it is
    when its import block is not one this can read (it is then left alone)."""
    try:
        before, after = ast.parse(original), ast.parse(migrated)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return migrated
    lines = migrated.split("\n")
    first_party = _first_party_roots(path)
    block = _leading_imports(after, first_party)
    old = [ast.dump(node) for node in _leading_statements(before)]
    # LibCST writes what it adds on one line; a grown import laid out over
    # lines keeps its layout (and the order of its names) as it is.
    new = [item for item in block if ast.dump(item.node) not in old and item.first == item.last]
    if not new:
        return _sections_kept_apart(migrated, original, before, first_party)
    lines = _sorted_names(lines, new, before)
    moving = [item for item in new if _is_new_statement(item, before)]
    staying = [item for item in block if item not in moving]
    if moving and staying and not _in_order(lines, block):
        lines = _moved(lines, moving, staying)
    elif moving and not staying and not _in_order(lines, block):
        lines = _laid_out(lines, moving)
    return _spaced_after_imports(_sections_kept_apart("\n".join(lines), original, before, first_party), before)


def _sections_kept_apart(migrated: str, original: str, before: ast.Module, first_party: Sequence[Path]) -> str:
    """MIGRATED with a blank line put back between two sections that touch,
    where the file's imports were in isort's order: a removed import (apex's)
    takes the blank lines above it along, which may have been the ones
    between the standard library and the third party."""
    try:
        after = ast.parse(migrated)
    except SyntaxError:
        return migrated
    lines = migrated.split("\n")
    if not _in_order(original.split("\n"), _leading_imports(before, first_party)):
        return migrated
    block = _leading_imports(after, first_party)
    touching = [b.first for a, b in zip(block, block[1:]) if a.section != b.section and b.first == a.last + 1]
    for index in reversed(touching):
        lines.insert(index, _blank_line(lines))
    return "\n".join(lines)


def _spaced_after_imports(migrated: str, before: ast.Module) -> str:
    """A statement a codemod put right after the imports is spaced as isort
    and black space it: one blank line after the imports (two before a
    function or class), two between it and a function or class that follows."""
    try:
        tree = ast.parse(migrated)
    except SyntaxError:
        return migrated
    leading = _leading_statements(tree)
    if not leading or len(tree.body) <= tree.body.index(leading[-1]) + 1:
        return migrated
    position = tree.body.index(leading[-1]) + 1
    inserted = tree.body[position]
    if ast.dump(inserted) in {ast.dump(node) for node in before.body}:
        return migrated
    lines = migrated.split("\n")
    follows = tree.body[position + 1] if position + 1 < len(tree.body) else None
    if isinstance(follows, _DEFINITIONS) and not isinstance(inserted, _DEFINITIONS):
        lines = _with_blank_lines(lines, inserted.end_lineno, _first_line(follows), 2)
    wanted = 2 if isinstance(inserted, _DEFINITIONS) else 1
    return "\n".join(_with_blank_lines(lines, leading[-1].end_lineno, _first_line(inserted), wanted))


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def _with_blank_lines(lines: list[str], after: int, before: int, count: int) -> list[str]:
    """LINES with exactly COUNT blank lines between line AFTER and line BEFORE
    (1-based), when only blank lines lie between them (a comment keeps its place)."""
    between = lines[after : before - 1]
    if any(line.strip() for line in between):
        return lines
    return lines[:after] + [_blank_line(lines)] * count + lines[before - 1 :]


def _blank_line(lines: list[str]) -> str:
    """An empty line, split at "\\n": "\\r" in a file with CRLF line ends."""
    return "\r" if lines and lines[0].endswith("\r") else ""


def _first_party_roots(path: Optional[str]) -> list[Path]:
    if path is None:
        return []
    folder = Path(path).resolve().parent
    root = next((f for f in [folder, *folder.parents] if (f / "pyproject.toml").is_file()), folder)
    return [root, root / "src"]


def first_party_layout(path: str) -> str:
    """What import sorting reads of the file system to call an import first
    party (`_section`): the modules and packages in the project's roots.
    A cached migration holds only for the same layout (a local package that
    appears moves an import to another section)."""
    names = []
    for root in _first_party_roots(path):
        try:
            with os.scandir(root) as entries:
                names += sorted(
                    f"{root}{os.sep}{entry.name}"
                    for entry in entries
                    if entry.name.removesuffix(".py").isidentifier() and (entry.name.endswith(".py") or entry.is_dir())
                )
        except OSError:
            continue  # no such folder: nothing there is first party
    return "\n".join(names)


def _section(node: ast.stmt, first_party: Sequence[Path]) -> tuple[int, str]:
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return RELATIVE, "." * node.level + (node.module or "")
        module = node.module or ""
    else:
        module = node.names[0].name
    top = module.split(".")[0]
    if top == "__future__":
        return FUTURE, module
    if top in sys.stdlib_module_names:
        return STANDARD_LIBRARY, module
    if any((root / top).is_dir() or (root / f"{top}.py").is_file() for root in first_party):
        return FIRST_PARTY, module
    return THIRD_PARTY, module


def _leading_statements(tree: ast.Module) -> list[ast.stmt]:
    """The imports at the top of the module, after a docstring and after the
    `...` that stand for a notebook's magics and shell lines (LibCST stops at
    those, and puts new imports above them)."""
    body = list(tree.body)
    if body and _is_constant(body[0], str):
        body = body[1:]
    leading = []
    for node in body:
        if _is_constant(node, type(Ellipsis)):
            continue
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            break
        leading.append(node)
    return leading


def _is_constant(node: ast.stmt, kind: type) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, kind)


def _leading_imports(tree: ast.Module, first_party: Sequence[Path]) -> list[_Import]:
    block = []
    for node in _leading_statements(tree):
        section, module = _section(node, first_party)
        block.append(_Import(node, node.lineno - 1, node.end_lineno - 1, section, isinstance(node, ast.ImportFrom), module))
    return block


def _is_new_statement(item: _Import, before: ast.Module) -> bool:
    """Not an old `from` import that gained names (that one stays where it is)."""
    if not item.is_from:
        return True
    return not any(
        isinstance(node, ast.ImportFrom) and node.module == item.node.module and node.level == item.node.level
        for node in _leading_statements(before)
    )


def _module_key(item: _Import, by_module_only: bool) -> tuple:
    key = (item.module.lower(), item.module)
    return key if by_module_only else (item.is_from, *key)


def _sorts_by_module_only(block: Sequence[_Import]) -> bool:
    """isort's force_sort_within_sections: a `from` import before a plain one of its section."""
    return any(a.section == b.section and a.is_from and not b.is_from for a, b in zip(block, block[1:]))


def _in_order(lines: list[str], block: Sequence[_Import]) -> bool:
    """Whether the block is laid out as isort would lay it out: sorted by
    section and module, a blank line between sections and none inside one."""
    by_module_only = _sorts_by_module_only(block)
    for a, b in zip(block, block[1:]):
        if (a.section, _module_key(a, by_module_only)) > (b.section, _module_key(b, by_module_only)):
            return False
        blank_between = any(not line.strip() for line in lines[a.last + 1 : b.first])
        if blank_between != (a.section != b.section):
            return False
    return True


def _moved(lines: list[str], moving: list[_Import], staying: list[_Import]) -> list[str]:
    """LINES with each import in MOVING taken out and put at its place among STAYING."""
    by_module_only = _sorts_by_module_only(staying)
    texts = {item: lines[item.first] for item in moving}
    doomed = {item.first for item in moving}
    # Where each goes: before a staying line (an index into LINES), or after the
    # last line of a section with a new group.
    before_line: dict[int, list[str]] = {}
    new_groups: dict[int, list[tuple[int, str]]] = {}  # before this line (-1: the block's top): (section, text)
    for item in sorted(moving, key=lambda i: (i.section, _module_key(i, by_module_only))):
        same = [s for s in staying if s.section == item.section]
        if same:
            later = [s for s in same if _module_key(s, by_module_only) > _module_key(item, by_module_only)]
            if later:
                before_line.setdefault(later[0].first, []).append(texts[item])
            else:
                before_line.setdefault(same[-1].last + 1, []).append(texts[item])
            continue
        earlier = [s for s in staying if s.section < item.section]
        # after the last section before it (after what joins that section), else at the top
        new_groups.setdefault(earlier[-1].last + 1 if earlier else -1, []).append((item.section, texts[item]))
    out: list[str] = []
    blank = _blank_line(lines)
    doomed |= _blank_lines_after_a_run_at_the_top(lines, doomed)
    doomed |= _separators_of_groups_left_empty(lines, moving)
    for index, line in enumerate(lines):
        if index == staying[0].first and -1 in new_groups:
            out += _sections(new_groups[-1], blank) + [blank]
        out += before_line.get(index, [])
        if index in new_groups:
            out += [blank] + _sections(new_groups[index], blank)
        if index not in doomed:
            out.append(line)
    return out


def _laid_out(lines: list[str], block: list[_Import]) -> list[str]:
    """LINES with an import block that is all new (a file that imported
    nothing at its top) sorted into its sections, when it is one run of
    one-line imports and blank lines (anything else stays as written)."""
    first, last = block[0].first, block[-1].last
    if sum(1 for index in range(first, last + 1) if lines[index].strip()) != len(block):
        return lines
    ordered = sorted(block, key=lambda item: (item.section, _module_key(item, by_module_only=False)))
    entries = [(item.section, lines[item.first]) for item in ordered]
    return lines[:first] + _sections(entries, _blank_line(lines)) + lines[last + 1 :]


def _blank_lines_after_a_run_at_the_top(lines: list[str], doomed: set[int]) -> set[int]:
    """The blank lines that separated imports put at the top (under the
    file's header comments: above a notebook's first magic) from what
    follows: they leave with the imports."""
    start = min(doomed)
    if any(line.strip() and not line.lstrip().startswith("#") for line in lines[:start]):
        return set()
    index = start
    while index in doomed:
        index += 1
    blanks = set()
    while index < len(lines) - 1 and not lines[index].strip():
        blanks.add(index)
        index += 1
    return blanks


def _separators_of_groups_left_empty(lines: list[str], moving: Sequence[_Import]) -> set[int]:
    """Imports that moving leaves no longer a group of their own (a run of
    them between blank lines) take the blank line above them along."""
    separators = set()
    moved = {index for item in moving for index in range(item.first, item.last + 1)}
    for item in moving:
        above = item.first - 1
        below = item.last + 1
        while below in moved:
            below += 1
        if above >= 0 and above not in moved and below < len(lines) and not lines[above].strip() and not lines[below].strip():
            separators.add(above)
    return separators


def _sections(entries: list[tuple[int, str]], blank: str) -> list[str]:
    """Import lines, sorted by section, with a blank line between sections."""
    out: list[str] = []
    for position, (section, text) in enumerate(entries):
        if position and section != entries[position - 1][0]:
            out.append(blank)
        out.append(text)
    return out


def _sorted_names(lines: list[str], new: list[_Import], before: ast.Module) -> list[str]:
    """The new and grown `from` imports (one line each, as LibCST writes
    them) with their names in isort's order: two words may add names to one
    new statement (`use_tf32_matmul`, then `fused_on_cuda`)."""
    lines = list(lines)
    for item in new:
        if not item.is_from:
            continue
        names = sorted(item.node.names, key=_member_key)
        if [a.name for a in names] == [a.name for a in item.node.names]:
            continue
        line = lines[item.first]
        indent = line[: len(line) - len(line.lstrip())]
        head = line.split(" import ", 1)[0].strip()
        comment = _trailing_comment(line)
        listed = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in names)
        lines[item.first] = f"{indent}{head} import {listed}{comment}"
    return lines


def _trailing_comment(line: str) -> str:
    return "  " + line[line.index("#") :] if "#" in line else ""


def _member_key(alias: ast.alias) -> tuple:
    """isort's and ruff's order of imported names (order-by-type): CONSTANTS,
    Classes, then everything else, each without case."""
    name = alias.name
    kind = 0 if name.isupper() and len(name) > 1 else (1 if name[:1].isupper() else 2)
    return kind, name.lower(), name, alias.asname or ""
