"""Module-level statements by their syntax: branches, targets, the names a
statement reads (at import or when called), the roots of what it changes."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from .._base import dotted_name, walk
from ..script.scopes import children


def names_only(target: cst.BaseExpression) -> bool:
    if isinstance(target, cst.Name):
        return True
    if isinstance(target, (cst.Tuple, cst.List)):
        return all(names_only(e.value) for e in target.elements)
    return False


def suites_of(statement: cst.CSTNode) -> list[cst.BaseSuite]:
    """Every branch of an `if` (with its `elif`s and `else`) or a `try`."""
    if isinstance(statement, cst.If):
        suites = [statement.body]
        orelse = statement.orelse
        while orelse is not None:
            suites.append(orelse.body)
            orelse = orelse.orelse if isinstance(orelse, cst.If) else None
        return suites
    parts = [statement.orelse, statement.finalbody] if isinstance(statement, cst.Try) else []
    return [statement.body, *(h.body for h in statement.handlers), *(p.body for p in parts if p is not None)]


def statements_in(suite: cst.BaseSuite) -> list[cst.CSTNode]:
    if isinstance(suite, cst.IndentedBlock):
        return list(suite.body)
    return [cst.SimpleStatementLine(body=list(suite.body))]  # `if x: a = 1` on one line


def tests_of(statement: cst.CSTNode) -> Iterator[cst.BaseExpression]:
    """The conditions an `if` evaluates, and the exception types a `try` names."""
    if isinstance(statement, cst.If):
        current: Optional[cst.CSTNode] = statement
        while isinstance(current, cst.If):
            yield current.test
            current = current.orelse
    elif isinstance(statement, cst.Try):
        yield from (h.type for h in statement.handlers if h.type is not None)


def assigned_names(statement: cst.CSTNode, value: cst.CSTNode) -> Optional[list[str]]:
    """The names a one-line assignment binds when `value` is in what it assigns; else None."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and all(names_only(t.target) for t in small.targets):
        targets = [t.target for t in small.targets]
    elif isinstance(small, cst.AnnAssign) and small.value is not None and names_only(small.target):
        targets = [small.target]
    else:
        return None
    if not any(node is value for node in walk(small.value)):
        return None
    return [n.value for t in targets for n in walk(t) if isinstance(n, cst.Name)]


def changed_roots(node: cst.CSTNode) -> Iterator[cst.Name]:
    """The names whose objects code may change: a method's receiver
    (`losses.append(x)`), what is passed to a call, assigned into
    (`cfg.lr = x`, `table[k] = x`), deleted, iterated or entered (`with x:`)."""
    for part in walk(node):
        if isinstance(part, cst.Call):
            if isinstance(part.func, cst.Attribute):
                yield from root_name(part.func.value)
            for arg in part.args:
                yield from root_name(arg.value)
        elif isinstance(part, cst.AssignTarget) or isinstance(part, (cst.AugAssign, cst.AnnAssign)):
            if isinstance(part.target, (cst.Attribute, cst.Subscript)):
                yield from root_name(part.target)
        elif isinstance(part, cst.Del):
            yield from root_name(part.target)
        elif isinstance(part, (cst.For, cst.CompFor)):
            yield from root_name(part.iter)
        elif isinstance(part, cst.WithItem):
            yield from root_name(part.item)


def root_name(expression: cst.BaseExpression) -> Iterator[cst.Name]:
    """`x` of `x`, `x.a.b`, `x[0]`, `x.f()`."""
    while isinstance(expression, (cst.Attribute, cst.Subscript, cst.Call)):
        expression = expression.func if isinstance(expression, cst.Call) else expression.value
    if isinstance(expression, cst.Name):
        yield expression
    elif isinstance(expression, (cst.Tuple, cst.List)):
        for element in expression.elements:
            yield from root_name(element.value)


def postpones_annotations(module: cst.Module) -> bool:
    """`from __future__ import annotations`: annotations are not evaluated."""
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if (
                    isinstance(small, cst.ImportFrom)
                    and small.module is not None
                    and dotted_name(small.module) == "__future__"
                    and not isinstance(small.names, cst.ImportStar)
                    and any(dotted_name(a.name) == "annotations" for a in small.names)
                ):
                    return True
    return False


def describe(node: cst.CSTNode) -> str:
    if isinstance(node, cst.FunctionDef):
        return f"function `{node.name.value}`"
    if isinstance(node, cst.ClassDef):
        return f"class `{node.name.value}`"
    return "this statement"


def read_names(node: cst.CSTNode, at_import: bool, postponed: bool) -> Iterator[cst.Name]:
    """The names `node` reads (and assigns: harmless here). With `at_import`,
    only those evaluated when the statement itself runs: a function's
    decorators, defaults and annotations, a class's bases and body; not the
    bodies of functions and lambdas."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            yield current
            continue
        if isinstance(current, (cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal)):
            continue
        stack.extend(reversed(_read_children(current, at_import, postponed)))


def _read_children(node: cst.CSTNode, at_import: bool, postponed: bool) -> list[cst.CSTNode]:
    if isinstance(node, cst.Attribute):
        return [node.value]
    if isinstance(node, cst.Arg):
        return [node.value]
    if isinstance(node, cst.Param):
        parts = [node.default]
        if not postponed:
            parts.append(node.annotation)
        return [p for p in parts if p is not None]
    if isinstance(node, cst.FunctionDef):
        parts: list = [d.decorator for d in node.decorators]
        parts.append(node.params)
        if node.returns is not None and not postponed:
            parts.append(node.returns)
        if not at_import:
            parts.append(node.body)
        return parts
    if isinstance(node, cst.ClassDef):
        return [*(d.decorator for d in node.decorators), *(a.value for a in (*node.bases, *node.keywords)), node.body]
    if isinstance(node, cst.Lambda):
        return [node.params] if at_import else [node.params, node.body]
    if isinstance(node, cst.Annotation) and postponed:
        return []
    return children(node)
