"""Inserting generated statements before or after statements of the file."""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from .._base import Codemod

BLOCKS = (cst.IndentedBlock, cst.Module)


def statement_of(script, node: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The statement of a block (a line, or a compound statement) that holds `node`."""
    current = node
    while current is not None:
        parent = script.parent(current)
        if isinstance(parent, BLOCKS) and current in parent.body:
            return current
        current = parent
    return None


def position(script, statement: cst.CSTNode) -> int:
    """The source position of a statement (a line is where its first small statement is)."""
    if isinstance(statement, cst.SimpleStatementLine) and statement.body:
        statement = statement.body[0]
    return script.index.order.get(statement, -1)


def block_of(script, statement: cst.CSTNode) -> Optional[cst.CSTNode]:
    parent = script.parent(statement)
    return parent if isinstance(parent, BLOCKS) else None


class Inserts:
    """Statements to insert, keyed by the original statement they go next to;
    `apply` rewrites a block's body (call it from leave_IndentedBlock and
    leave_Module with the original and updated bodies)."""

    def __init__(self) -> None:
        self.before: dict[cst.CSTNode, list[str]] = {}
        self.after: dict[cst.CSTNode, list[str]] = {}

    def add_before(self, statement: cst.CSTNode, code: str) -> None:
        self.before.setdefault(statement, []).append(code)

    def add_after(self, statement: cst.CSTNode, code: str) -> None:
        self.after.setdefault(statement, []).append(code)

    def __bool__(self) -> bool:
        return bool(self.before or self.after)

    def apply(self, module: cst.Module, originals: Sequence[cst.CSTNode], updated: Sequence[cst.CSTNode]) -> list:
        if not any(s in self.before or s in self.after for s in originals):
            return list(updated)
        result: list[cst.CSTNode] = []
        for original, statement in zip(originals, updated):
            before = [_parse(module, code) for code in self.before.get(original, ())]
            if before:
                # The blank lines above the anchor now come before what is inserted;
                # its comments stay with it.
                blank = _leading_blank_lines(statement.leading_lines)
                before[0] = before[0].with_changes(leading_lines=statement.leading_lines[:blank])
                statement = statement.with_changes(leading_lines=statement.leading_lines[blank:])
            result.extend(before)
            result.append(statement)
            result.extend(_parse(module, code) for code in self.after.get(original, ()))
        return result


def _leading_blank_lines(lines: Sequence[cst.EmptyLine]) -> int:
    count = 0
    while count < len(lines) and lines[count].comment is None:
        count += 1
    return count


def _parse(module: cst.Module, code: str) -> cst.BaseStatement:
    return cst.parse_statement(f"{code}{module.default_newline}", config=module.config_for_parsing)


class InsertingCodemod(Codemod):
    """A codemod that inserts statements: `self.inserts` is applied on the way out."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.inserts = Inserts()

    def visit_Module(self, node: cst.Module) -> None:
        self._module = node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if not self.inserts:
            return updated_node
        return updated_node.with_changes(body=self.inserts.apply(self._module, original_node.body, updated_node.body))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self.inserts:
            return updated_node
        return updated_node.with_changes(body=self.inserts.apply(original_node, original_node.body, updated_node.body))


def torch_spelling(script, at: cst.CSTNode, codemod: Codemod) -> Optional[str]:
    """A name that reads the torch module at `at` (`torch`, or the file's alias);
    when none does and `torch` is free there, `torch` with an import scheduled."""
    from ..script.ddp_spelling import is_unbound, spelling_at

    spelled = spelling_at(script, at, (("torch", ""),))
    if spelled is not None:
        return spelled
    if is_unbound(script, at, "torch"):
        codemod.add_import("torch")
        return "torch"
    return None


__all__ = ["InsertingCodemod", "Inserts", "block_of", "position", "statement_of", "torch_spelling"]
