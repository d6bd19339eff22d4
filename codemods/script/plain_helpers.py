"""The runtime's helpers as plain definitions a migrated file carries.

plain_definitions.py holds them as source; this module reads it (with
`ast`, never importing it: the tool needs no torch) into `Definition`s:
each one's code, the other definitions and the modules it uses, and the
runtime function it stands for. The engine's plain-code pass
(accelmigrate/engine/plain_code.py) writes them into migrated files; the
script model asks `runtime_name_of` so that a file carrying one is read as
if it imported the runtime's helper (a migrated file migrates again to
itself).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import libcst as cst

SOURCE = Path(__file__).with_name("plain_definitions.py")


@dataclasses.dataclass(frozen=True)
class Definition:
    """One function or class of plain_definitions.py."""

    name: str
    code: str
    needs: tuple[str, ...]  # the other definitions it uses, in the file's order
    modules: tuple[tuple[str, Optional[str]], ...]  # the imports it needs: (`os`, None), (`torch.distributed`, `dist`)
    runtime: Optional[str]  # the runtime function it stands for; None for a private helper of the others
    docstring: Optional[str]  # its words, whitespace folded


def definitions() -> dict[str, Definition]:
    return _read()


@functools.lru_cache(maxsize=1)
def _read() -> dict[str, Definition]:
    text = SOURCE.read_text(encoding="utf-8")
    tree = ast.parse(text)
    imported: dict[str, tuple[str, Optional[str]]] = {}  # the name an import binds -> (module, asname)
    replaces: dict[str, str] = {}
    units: list[tuple[str, ast.stmt]] = []
    for statement in tree.body:
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                imported[alias.asname or alias.name.split(".")[0]] = (alias.name, alias.asname)
        elif isinstance(statement, ast.Assign) and _target(statement) == "REPLACES":
            replaces = ast.literal_eval(statement.value)
        elif isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
            units.append((statement.name, statement))
    names = [name for name, _ in units]
    found = {}
    for name, statement in units:
        used = {node.id for node in ast.walk(statement) if isinstance(node, ast.Name)}
        found[name] = Definition(
            name,
            _code(text, statement),
            tuple(other for other in names if other != name and other in used),
            tuple(sorted(imported[n] for n in used if n in imported)),
            f"{replaces[name]}.{name}" if name in replaces else None,
            _folded(ast.get_docstring(statement)),
        )
    return found


def _target(statement: ast.Assign) -> str:
    return statement.targets[0].id if isinstance(statement.targets[0], ast.Name) else ""


def _code(text: str, statement: ast.stmt) -> str:
    """The statement's lines, its decorators included."""
    decorators = getattr(statement, "decorator_list", None)
    first = decorators[0].lineno if decorators else statement.lineno
    return "\n".join(text.splitlines()[first - 1 : statement.end_lineno])


def _folded(docstring: Optional[str]) -> Optional[str]:
    return " ".join(docstring.split()) if docstring else None


def closure(names) -> list[Definition]:
    """The definitions of `names` and of everything they use, in the order
    of plain_definitions.py (each after what it uses)."""
    known = definitions()
    wanted: set[str] = set()
    pending = [n for n in names if n in known]
    while pending:
        name = pending.pop()
        if name not in wanted:
            wanted.add(name)
            pending.extend(known[name].needs)
    return [d for name, d in known.items() if name in wanted]


def runtime_name_of(node: cst.CSTNode) -> Optional[str]:
    """The runtime function (or class) a file's definition stands for."""
    definition = carried_definition(node)
    return definition.runtime if definition is not None else None


def carried_definition(node: cst.CSTNode) -> Optional[Definition]:
    """The plain definition a file's function or class is: one with the name
    and the docstring of a plain definition."""
    import libcst as cst  # loaded already wherever there is a tree to ask about

    if not isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        return None
    definition = definitions().get(node.name.value)
    if definition is None or definition.docstring is None:
        return None
    docstring = node.get_docstring(clean=True)
    return definition if docstring is not None and _folded(docstring) == definition.docstring else None


@functools.lru_cache(maxsize=16)
def carried_lines(source: str) -> tuple[int, ...]:
    """The lines of the plain definitions `source` carries (found again by
    name and docstring), which no codemod rewrites: they are written for
    every device and launch already. Asked for the pre-check and for the
    suppressions of the same text: kept for a few texts."""
    known = definitions()
    if not any(f"def {name}(" in source or f"class {name}(" in source for name in known):
        return ()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    lines: list[int] = []
    for statement in tree.body:
        definition = known.get(getattr(statement, "name", ""))
        if isinstance(statement, (ast.FunctionDef, ast.ClassDef)) and definition is not None and definition.docstring:
            if _folded(ast.get_docstring(statement)) == definition.docstring:
                first = statement.decorator_list[0].lineno if statement.decorator_list else statement.lineno
                lines.extend(range(first, statement.end_lineno + 1))
    return tuple(lines)


def without_carried(source: str) -> str:
    """`source` with the lines of its plain definitions left empty (the line
    numbers kept): what the pre-checks read, so that a definition's own words
    (`cuda`, `DataLoader`) wake no codemod on a second run that the first
    run's file did not."""
    lines = set(carried_lines(source))
    if not lines:
        return source
    return "".join("\n" if number in lines else line for number, line in enumerate(source.splitlines(keepends=True), 1))
