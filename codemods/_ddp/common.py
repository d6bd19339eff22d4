"""What every part of the ddp codemod shares: the runtime module the
migrated code imports, the plan's data types, and helpers on syntax alone.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import libcst as cst

from .._base import append_keyword_args, dotted_name, keyword_arg
from .._syntax import without_parentheses

RUNTIME = "accelmigrate.runtime.distributed"
Edit = Callable[[cst.CSTNode], cst.CSTNode]


class CannotMigrate(Exception):
    """A step that cannot be done safely; the message is the finding."""

    def __init__(self, node: cst.CSTNode, code: str, message: str) -> None:
        super().__init__(message)
        self.node, self.code, self.message = node, code, message


@dataclasses.dataclass(frozen=True)
class Var:
    """A variable: a name in a scope, or `self.<name>` within a class."""

    name: str
    owner: object  # the model's Scope of a name, the ClassDef of a self attribute
    is_attribute: bool = False

    @property
    def code(self) -> str:
        return f"self.{self.name}" if self.is_attribute else self.name


@dataclasses.dataclass
class Step:
    """One planned rewrite: recorded as a fix, then applied, unless suppressed."""

    node: cst.CSTNode
    code: str
    message: str
    apply: Callable[[], None]
    core: bool = False  # suppressing it turns ddp off for the file


@dataclasses.dataclass
class Insertion:
    statement: cst.BaseStatement
    # "none": the anchor keeps its leading lines; "all": the inserted statement
    # takes them (comments above the anchor describe it); "blank": it takes the
    # blank lines above the anchor's comments.
    take_leading: str = "none"


def header(statement: cst.CSTNode) -> cst.CSTNode:
    """A node on the first line of a statement, for a finding about the
    statement as a whole (a skip comment inside its body is not about it)."""
    if isinstance(statement, (cst.For,)):
        return statement.target
    if isinstance(statement, (cst.If, cst.While)):
        return statement.test
    if isinstance(statement, cst.With):
        return statement.items[0]
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return statement.name
    return statement


def loop_body(loop: cst.CSTNode) -> cst.CSTNode:
    """What runs once per item: a `for` statement's body, a whole comprehension."""
    return loop.body if isinstance(loop, cst.For) else loop


def last_name(node: cst.BaseExpression) -> str:
    return node.attr.value if isinstance(node, cst.Attribute) else node.value


def call_of(name: str, *args: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Name(name), args=[cst.Arg(without_parentheses(a)) for a in args])


def keyword_of(arg: cst.Arg) -> Optional[str]:
    return arg.keyword.value if arg.keyword is not None else None


def first_positional(call: cst.Call) -> Optional[cst.Arg]:
    for arg in call.args:
        if arg.keyword is None and not arg.star:
            return arg
        if arg.star:
            return None
    return None


def set_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    if keyword_arg(call, name) is None:
        return append_keyword_args(call, [(name, value)])
    return call.with_changes(args=[a.with_changes(value=value) if keyword_of(a) == name else a for a in call.args])


def as_atom(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node`, parenthesised when a following `.attr` would bind to a part of it."""
    if node.lpar or isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.List, cst.Tuple, cst.Dict)):
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def is_none(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def is_plain_reference(node: cst.CSTNode) -> bool:
    """A name or a chain of attributes (`loader`, `self.groups.data`): cheap
    and free of side effects to evaluate again."""
    return bool(dotted_name(node))


def dataset_name_for(target: cst.BaseExpression) -> str:
    name = target.attr.value if isinstance(target, cst.Attribute) else target.value
    for suffix in ("_loader", "loader", "_dataloader", "dataloader"):
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)].rstrip("_") + "_dataset"
    return "dataset"


def take_leading(anchor: cst.CSTNode, insertion: Insertion) -> tuple[cst.CSTNode, cst.BaseStatement]:
    """Split the anchor's leading lines between it and the statement inserted before it."""
    leading = list(getattr(anchor, "leading_lines", ()))
    if insertion.take_leading == "all":
        return anchor.with_changes(leading_lines=[]), insertion.statement.with_changes(leading_lines=leading)
    if insertion.take_leading == "blank":
        blank = []
        for line in leading:
            if line.comment is not None:
                break
            blank.append(line)
        return anchor, insertion.statement.with_changes(leading_lines=blank)
    return anchor, insertion.statement
