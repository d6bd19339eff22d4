"""Small syntax helpers over LibCST nodes, shared by the codemods and the
script model (codemods/script/). They depend on LibCST alone: the script
model reads them without importing the codemods' base class, which itself
builds on the script model."""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterator, Optional

import libcst as cst

# Gradient clipping, by every path torch exports it under.
CLIP_GRAD_FUNCTIONS = frozenset(
    {
        "torch.nn.utils.clip_grad_norm_",
        "torch.nn.utils.clip_grad_norm",
        "torch.nn.utils.clip_grad_value_",
        "torch.nn.utils.clip_grad.clip_grad_norm_",
        "torch.nn.utils.clip_grad.clip_grad_norm",
        "torch.nn.utils.clip_grad.clip_grad_value_",
    }
)

_DEFINITIONS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
_EMPTY_MODULE = cst.Module(body=[])


def code_of(node: cst.CSTNode) -> str:
    """The source text of a node."""
    return _EMPTY_MODULE.code_for_node(node)


def walk(node: cst.CSTNode, *, into_definitions: bool = True) -> Iterator[cst.CSTNode]:
    """`node` and everything below it, in source order. Reads the dataclass
    fields directly: LibCST's `children` rebuilds every node it lists, which
    costs minutes on big files. Without `into_definitions`, the functions,
    classes and lambdas defined inside are skipped (they run at other times)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        found = children(current)
        if not into_definitions:
            found = [child for child in found if not isinstance(child, _DEFINITIONS)]
        stack.extend(reversed(found))


def parent_map(module: cst.Module) -> dict[cst.CSTNode, cst.CSTNode]:
    """Every node's parent, as LibCST's ParentNodeProvider gives it."""
    parents: dict[cst.CSTNode, cst.CSTNode] = {}
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        for child in children(node):
            parents[child] = node
            stack.append(child)
    return parents


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node`'s children, in source order, read from its dataclass fields."""
    found: list[cst.CSTNode] = []
    for name in _child_fields(type(node)):
        value = getattr(node, name)
        kind = type(value)
        if kind is list or kind is tuple:
            found.extend(item for item in value if _is_node_type(type(item)))
        elif _is_node_type(kind):
            found.append(value)
    return found


@functools.lru_cache(maxsize=None)
def _child_fields(node_type: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(node_type))


_node_types: dict[type, bool] = {}


def _is_node_type(kind: type) -> bool:
    """issubclass(kind, CSTNode), remembered: CSTNode is an abstract class,
    and testing one costs far more than a dictionary look-up."""
    known = _node_types.get(kind)
    if known is None:
        known = _node_types[kind] = issubclass(kind, cst.CSTNode)
    return known


def dotted_name(node: cst.BaseExpression) -> str:
    """`a.b.c` for a chain of names and attributes, else ""."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        prefix = dotted_name(node.value)
        return f"{prefix}.{node.attr.value}" if prefix else ""
    return ""


def is_main_guard(test: cst.BaseExpression) -> bool:
    """`__name__ == "__main__"`, either way round."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return False
    sides = [test.left, test.comparisons[0].comparator]
    return isinstance(test.comparisons[0].operator, cst.Equal) and any(
        isinstance(s, cst.Name) and s.value == "__name__" for s in sides
    ) and any(isinstance(s, cst.SimpleString) and s.evaluated_value == "__main__" for s in sides)


def is_docstring(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


_TIGHT_OPERANDS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)
_TIGHT_OPERATORS = (cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.MatrixMultiply, cst.Power)


def times_or_divided(value: cst.BaseExpression, operator: cst.BaseBinaryOp, by: str) -> cst.BinaryOperation:
    """`value * by` or `value / by`, parenthesising `value` when its operators
    bind less tightly."""
    tight = isinstance(value, _TIGHT_OPERANDS) or bool(getattr(value, "lpar", ())) or (
        isinstance(value, cst.BinaryOperation) and isinstance(value.operator, _TIGHT_OPERATORS)
    )
    if not tight:
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    spaced = operator.with_changes(whitespace_before=cst.SimpleWhitespace(" "), whitespace_after=cst.SimpleWhitespace(" "))
    return cst.BinaryOperation(left=value, operator=spaced, right=cst.Name(by))



def keyword_arg(call: cst.Call, name: str) -> Optional[cst.Arg]:
    """The `name=...` argument of `call`, if given."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def has_star_args(call: cst.Call) -> bool:
    """`f(*args)` or `f(**kwargs)`: what the call passes cannot be seen."""
    return any(arg.star in ("*", "**") for arg in call.args)


__all__ = ["CLIP_GRAD_FUNCTIONS", "children", "code_of", "dotted_name", "has_star_args", "is_docstring", "is_main_guard", "keyword_arg", "parent_map", "times_or_divided", "walk"]


def in_place_of(replaced: cst.CSTNode, replacement: cst.CSTNode) -> cst.CSTNode:
    """`replacement`, standing where `replaced` stood: an expression keeps the
    parentheses that `replaced` was written with. They may be all that
    separates it from a keyword (`elif(x):`, `return(x)`), and around a whole
    expression they never change what it means."""
    written_with = getattr(replaced, "lpar", None)
    if (
        written_with
        and replacement is not replaced
        and isinstance(replacement, cst.BaseExpression)
        and not getattr(replacement, "lpar", None)
        and hasattr(replacement, "lpar")
    ):
        return replacement.with_changes(lpar=replaced.lpar, rpar=replaced.rpar)
    return replacement


def without_parentheses(argument: cst.BaseExpression) -> cst.BaseExpression:
    """A whole call argument needs no parentheses of its own (a generator
    expression keeps them: it needs them beside other arguments)."""
    if getattr(argument, "lpar", None) and not isinstance(argument, cst.GeneratorExp):
        return argument.with_changes(lpar=[], rpar=[])
    return argument


# A cell marker opens a cell: `# %% [accelmigrate cell N]` in a notebook's
# cells as the engine joins them, `# %%` in a percent-format script (Jupytext,
# VS Code, Spyder). Each cell runs on its own.
CELL_MARKER = "# %%"


def is_cell_marker(line: cst.EmptyLine) -> bool:
    return line.comment is not None and line.comment.value.startswith(CELL_MARKER)


def starts_cell(statement: cst.CSTNode) -> bool:
    """A cell marker is among the comment lines above the statement."""
    return any(is_cell_marker(line) for line in getattr(statement, "leading_lines", ()))
