"""Small syntax helpers of `modernize`: assignments and their parts, literal
flags, calls built in place of others, and names bound or read."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from .._base import code_of, walk
from ..script import ScriptModel
from ..script.scopes import Binding, Scope

Expression = cst.BaseExpression


def assigned(binding: Binding) -> Optional[Expression]:
    """The value a binding gives: `x = value`, or the matching part of
    `a, b = value_a, value_b`."""
    if binding.value is not None:
        return binding.value
    statement = binding.statement
    if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
        return None
    for target, value in target_value_pairs(statement.targets[0].target, statement.value):
        if target is binding.node:
            return value
    return None


def target_value_pairs(target: cst.CSTNode, value: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, Expression]]:
    """(target, value) for each part of `a, b = x, y`, or the one pair."""
    if isinstance(target, (cst.Tuple, cst.List)):
        if not isinstance(value, (cst.Tuple, cst.List)) or len(target.elements) != len(value.elements):
            return
        if any(isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements)):
            return
        for t, e in zip(target.elements, value.elements):
            yield from target_value_pairs(t.value, e.value)
    else:
        yield target, value


def assigned_names(model: ScriptModel, value: Expression) -> list[str]:
    """The names that `value` is assigned to, where it is a whole value or a
    part matched by unpacking: `data` in `data, y = Variable(data), y`."""
    node: cst.CSTNode = value
    parent = model.parent(node)
    while isinstance(parent, (cst.Element, cst.Tuple, cst.List)):
        node, parent = parent, model.parent(parent)
    if not isinstance(parent, cst.Assign):
        return []
    return [
        name.value
        for target in parent.targets
        for name, part in target_value_pairs(target.target, parent.value)
        if part is value and isinstance(name, cst.Name)
    ]


def literal_flag(value: Expression):
    """True / False / None for those literals, else "?"."""
    if isinstance(value, cst.Name) and value.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[value.value]
    return "?"


def is_true(value: Expression) -> bool:
    return literal_flag(value) is True


def is_false(value: Expression) -> bool:
    return literal_flag(value) is False


def method_call(receiver: Expression, method: str, like: Optional[Expression] = None, args=()) -> cst.Call:
    """`receiver.method(args)`, parenthesising a receiver that needs it, with
    the parentheses of the node it replaces."""
    if not _is_atomic(receiver):
        receiver = receiver.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    call = cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name(method)), args=list(args))
    if like is not None:
        call = call.with_changes(lpar=like.lpar, rpar=like.rpar)
    return call


def _is_atomic(value: Expression) -> bool:
    return bool(value.lpar) or isinstance(
        value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.SimpleString, cst.Integer, cst.Float,
                cst.List, cst.Tuple, cst.Dict, cst.Set)
    )  # fmt: skip


_LOOSE_CONTEXTS = (cst.Arg, cst.Element, cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Return, cst.Expr, cst.DictElement)


def in_context(value: Expression, parent: Optional[cst.CSTNode], replaced: cst.Call) -> Expression:
    """`value` where `replaced` was: in parentheses when it would bind less
    tightly than the call it replaces."""
    if replaced.lpar:
        return value.with_changes(lpar=replaced.lpar, rpar=replaced.rpar)
    if _is_atomic(value) or isinstance(parent, _LOOSE_CONTEXTS):
        return value
    return value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def is_plain_literal(value: Expression) -> bool:
    return isinstance(value, (cst.Integer, cst.Float, cst.SimpleString)) or (
        isinstance(value, cst.Name) and value.value in ("True", "False", "None")
    )


def operand(value: Expression) -> str:
    return code_of(value) if _is_atomic(value) else f"({code_of(value)})"


def root_name(value: Expression) -> Optional[str]:
    while isinstance(value, (cst.Attribute, cst.Call, cst.Subscript)):
        value = value.func if isinstance(value, cst.Call) else value.value
    return value.value if isinstance(value, cst.Name) else None


def target_names(target: cst.CSTNode) -> set[str]:
    return {n.value for n in walk(target) if isinstance(n, cst.Name)} if not isinstance(target, cst.Attribute) else set()


def bound_names(statements: list) -> set[str]:
    """The plain names the statements assign (not attributes or items)."""
    names: set[str] = set()
    for statement in statements:
        for node in walk(statement, into_definitions=False):
            if isinstance(node, cst.AssignTarget):
                names |= plain_target_names(node.target)
            elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
                names |= plain_target_names(node.target)
            elif isinstance(node, (cst.For, cst.CompFor)):
                names |= plain_target_names(node.target)
            elif isinstance(node, cst.WithItem) and node.asname is not None:
                names |= plain_target_names(node.asname.name)
    return names


def plain_target_names(target: cst.CSTNode) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(plain_target_names(e.value) for e in target.elements)) if target.elements else set()
    if isinstance(target, cst.StarredElement):
        return plain_target_names(target.value)
    return set()


def reads_any(statement: cst.CSTNode, names: list[str]) -> bool:
    return any(isinstance(n, cst.Name) and n.value in names for n in walk(statement))


def _is_binding_target(model: ScriptModel, name: cst.Name) -> bool:
    """`name` is (part of) what an assignment, `for` or `with` binds, not a read."""
    child: cst.CSTNode = name
    for ancestor in model.ancestors(name):
        if isinstance(ancestor, cst.AssignTarget):
            return True
        if isinstance(ancestor, (cst.For, cst.CompFor)) and child is ancestor.target:
            return True
        if isinstance(ancestor, (cst.AnnAssign,)) and child is ancestor.target:
            return True
        if isinstance(ancestor, cst.AsName):
            return True
        if not isinstance(ancestor, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
            return False
        child = ancestor
    return False


def in_import(model: ScriptModel, node: cst.CSTNode) -> bool:
    return any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in model.ancestors(node))


def reads_outside(model: ScriptModel, scope: Scope, name: str, statements: list) -> list[cst.Name]:
    """Every read of the variable `name` of `scope` outside `statements`."""
    inside = {id(n) for statement in statements for n in walk(statement)}
    return [
        node
        for node in walk(scope.node)
        if isinstance(node, cst.Name) and node.value == name and id(node) not in inside
        and model.index.home_of(name, model.scope_of(node)) is scope
        and not _is_binding_target(model, node)
    ]  # fmt: skip
