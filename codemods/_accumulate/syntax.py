"""Small questions about syntax that the loop reading and the rewrite ask."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import libcst as cst

from .._base import code_of, walk


@dataclasses.dataclass
class Problem:
    """Why a loop or a value is left alone: the finding to report."""

    node: cst.CSTNode
    code: str
    message: str


def target_key(node: cst.CSTNode) -> Optional[str]:
    """`name` or `self.attr` (a dotted chain of names): something a value can be
    bound to and found again by its spelling."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute) and target_key(node.value) is not None:
        return code_of(node)
    return None


def mentions(node: cst.CSTNode, key: str) -> bool:
    """Does `key` (as `target_key` spells it) occur inside `node`?"""
    return key in spellings(node)


def spellings(node: cst.CSTNode) -> set[str]:
    """The names and attribute chains read or written inside `node` (not the
    `attr` of an attribute, nor an argument's keyword)."""
    found, skipped = set(), set()
    for current in walk(node):
        if isinstance(current, cst.Attribute):
            skipped.add(id(current.attr))
        elif isinstance(current, cst.Arg) and current.keyword is not None:
            skipped.add(id(current.keyword))
        if isinstance(current, (cst.Name, cst.Attribute)) and id(current) not in skipped:
            key = target_key(current)
            if key is not None:
                found.add(key)
    return found


def is_method_call(node: cst.CSTNode, method: str) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == method


def receiver(call: cst.Call) -> cst.BaseExpression:
    return call.func.value  # type: ignore[union-attr]


def positional_args(call: cst.Call) -> list[cst.Arg]:
    return [arg for arg in call.args if arg.keyword is None and not arg.star]


def wrap_block(header: str, statements: Sequence[cst.BaseStatement]) -> cst.BaseCompoundStatement:
    """`header:` (an `if` or `with` line) over `statements`; the comments above the
    first statement move above the new header."""
    compound = cst.parse_statement(f"{header}:\n    pass\n")
    first, rest = statements[0], list(statements[1:])
    leading = getattr(first, "leading_lines", ())
    if leading:
        first = first.with_changes(leading_lines=[])
    return compound.with_changes(body=compound.body.with_changes(body=[first, *rest]), leading_lines=leading)


__all__ = ["Problem", "is_method_call", "mentions", "positional_args", "receiver", "spellings", "target_key", "wrap_block"]
