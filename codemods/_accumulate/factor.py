"""The `word=N` factor (parsed by `codemods/_options.py`), and the module constant (`ACCUMULATION_STEPS = 4`,
`BATCH_SCALE = 2`) that carries it in the migrated script."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import is_docstring
from .._options import parse_factor  # the option checks live where the registry reads them without LibCST


def fresh_name(base: str, taken: set[str]) -> str:
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name


def module_constant(module: cst.Module, name: str) -> Optional[cst.Assign]:
    """The module-level `NAME = ...` assignment, if there is one."""
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign) and any(
                    isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets
                ):
                    return small
    return None


def is_integer(node: cst.BaseExpression, value: int) -> bool:
    return isinstance(node, cst.Integer) and int(node.value, 0) == value


def constant_statement(name: str, value: int, comment: str) -> cst.SimpleStatementLine:
    return cst.parse_statement(f"{name} = {value}  # {comment}\n")


def insert_module_statement(module: cst.Module, statement: cst.SimpleStatementLine) -> cst.Module:
    """`module` with `statement` after its opening docstring and imports (so
    that imports added later still come first), set apart by a blank line
    when something comes before it."""
    position = _after_docstring_and_imports(module)
    if position > 0:
        statement = statement.with_changes(leading_lines=[cst.EmptyLine()])
    body = list(module.body)
    return module.with_changes(body=[*body[:position], statement, *body[position:]])


def _after_docstring_and_imports(module: cst.Module) -> int:
    index = 0
    for i, statement in enumerate(module.body):
        if i == 0 and is_docstring(statement):
            index = 1
        elif _is_import_line(statement):
            index = i + 1
        else:
            break
    return index


def _is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


__all__ = ["constant_statement", "fresh_name", "insert_module_statement", "is_integer", "module_constant", "parse_factor"]
