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
import contextlib
import contextvars
import dataclasses
import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

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


# The torch the file being written targets, as (major, minor); None: the newest.
_torch = contextvars.ContextVar("plain_definitions_torch", default=None)
_VARIANT = re.compile(r"^(\w+?)_before_(\d+)_(\d+)$")


@contextlib.contextmanager
def for_torch(version: Optional[tuple[int, int]]) -> Iterator[None]:
    """Within it, `closure` gives the definitions as that torch spells them
    (a `<name>_before_<major>_<minor>` variant where the version is older)."""
    token = _torch.set(version)
    try:
        yield
    finally:
        _torch.reset(token)


def definitions() -> dict[str, Definition]:
    return _read()[0]


def _as_targeted(definition: Definition) -> Definition:
    version = _torch.get()
    if version is not None:
        for before, variant in _read()[1].get(definition.name, ()):
            if version < before:
                return variant
    return definition


@functools.lru_cache(maxsize=1)
def _read() -> tuple[dict[str, Definition], dict[str, list[tuple[tuple[int, int], Definition]]]]:
    """The definitions by name, and each one's variants for older torches
    (oldest bound first), named and documented as the definition itself."""
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
    names = [name for name, _ in units if not _VARIANT.match(name)]
    found: dict[str, Definition] = {}
    variants: dict[str, list[tuple[tuple[int, int], Definition]]] = {}
    for name, statement in units:
        variant = _VARIANT.match(name)
        base = variant.group(1) if variant else name
        used = {node.id for node in ast.walk(statement) if isinstance(node, ast.Name)}
        definition = Definition(
            base,
            _code(text, statement).replace(f"def {name}(", f"def {base}(", 1),
            tuple(other for other in names if other != base and other in used),
            tuple(sorted(imported[n] for n in used if n in imported)),
            f"{replaces[base]}.{base}" if base in replaces else None,
            _folded(ast.get_docstring(statement)),
        )
        if variant:
            before = (int(variant.group(2)), int(variant.group(3)))
            variants.setdefault(base, []).append((before, definition))
        else:
            found[name] = definition
    for base, listed in variants.items():
        listed.sort(key=lambda item: item[0])
        assert all(d.docstring == found[base].docstring for _, d in listed), f"{base}: a variant's docstring differs"
    return found, variants


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
    of plain_definitions.py (each after what it uses), as the targeted torch
    spells them (`for_torch`)."""
    known = {name: _as_targeted(definition) for name, definition in definitions().items()}
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
