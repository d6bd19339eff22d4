"""What the `amp` codemod plans before it changes anything: the names it
matches, the training steps it can migrate, the bindings it adds."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Union

import libcst as cst

PRECISION = "accelmigrate.runtime.precision"
AUTOCAST_DTYPE = f"{PRECISION}.autocast_dtype"
GRAD_SCALER_FACTORY = f"{PRECISION}.grad_scaler"
RUNTIME_DEVICE = "accelmigrate.runtime.device."  # get_device(), device_at(...): where data goes
RAW_AUTOGRAD = frozenset({"torch.autograd.grad", "torch.autograd.backward"})


def unscalable_argument(call: cst.Call) -> Optional[cst.Arg]:
    """The first argument of `loss.backward(...)` that `scaler.scale(loss)`
    cannot keep: a gradient (positional or `gradient=`), `inputs=` (leaves
    that no optimizer unscales), `create_graph=` other than False (gradients
    with a graph are differentiated again, at the loss scale), `*`/`**`.
    `retain_graph=` only keeps the graph for the next backward, as in
    PyTorch's AMP examples for several losses."""
    for arg in call.args:
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword == "retain_graph" and not arg.star:
            continue
        if keyword == "create_graph" and isinstance(arg.value, cst.Name) and arg.value.value == "False":
            continue
        return arg
    return None

APEX = "apex.amp"
APEX_INITIALIZE = "apex.amp.initialize"
APEX_SCALE_LOSS = "apex.amp.scale_loss"
APEX_MASTER_PARAMS = "apex.amp.master_params"
APEX_STATE_DICT = "apex.amp.state_dict"
APEX_LOAD_STATE_DICT = "apex.amp.load_state_dict"

# Calls that only move or cast data: such statements at the start of a forward
# pass stay outside the autocast region (they compute nothing it would change).
MOVES = frozenset({"to", "cuda", "cpu", "float", "half", "double", "long", "int", "bool", "contiguous", "pin_memory", "type"})
# Methods that read or move tensors and modules without computing with them.
ACCESSORS = frozenset({
    "parameters", "named_parameters", "buffers", "named_buffers", "modules", "named_modules", "children",
    "state_dict", "detach", "item", "tolist", "numel", "size", "dim", "cpu", "to", "clone",
    "keys", "values", "items", "append", "extend", "eval", "train", "zero_grad",
})
CPU = "cpu"  # the kind of the device Ref of a script that computes on the CPU only
CPU_TEXT = '"cpu"'
SCALER_NAMES = ("scaler", "amp_scaler")
DTYPE_NAMES = ("amp_dtype", "autocast_dtype_")
NO_SPACE_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))

Block = Union[cst.IndentedBlock, cst.Module]


def is_block(node: Optional[cst.CSTNode]) -> bool:
    return isinstance(node, (cst.IndentedBlock, cst.Module))


def is_import_line(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in node.body)


def statement(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text + "\n")


def without_parens(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


def method_call(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == name


@dataclasses.dataclass
class Ref:
    """A device or an optimizer: a variable (`kind` "name", bound in scope
    `home`), an attribute of `self` (`kind` "attr", `home` the ClassDef), a
    parameter (`kind` "param"), or the CPU of a script that names no device
    (`kind` CPU, `home` the module scope, no bindings)."""

    kind: str
    name: str
    home: object
    bindings: list  # the statement lines that bind it

    @property
    def key(self) -> tuple:
        return (self.kind, id(self.home), self.name)


@dataclasses.dataclass
class Backward:
    statement: cst.BaseStatement  # the line `loss.backward()`, or apex's `with amp.scale_loss(...)`
    call: Optional[cst.Call]  # `loss.backward()`; None for apex
    loss: cst.BaseExpression
    apex: Optional[cst.With] = None


@dataclasses.dataclass
class Region:
    """Statements `first`..`last` of one block, to run under autocast."""

    block: Block
    first: cst.BaseStatement
    last: cst.BaseStatement
    header: str = ""  # the `torch.autocast(...)` expression


@dataclasses.dataclass
class StepPlan:
    """One training step (a loop body or a function body) that can be migrated."""

    backwards: list
    device: Ref
    optimizers: list  # distinct Refs, in order of first step
    steps: list  # (step call, Ref)
    regions: list
    unscales: list  # (statement to insert before, [Ref...], clipping node for the finding)
    update_after: cst.BaseStatement
    site: cst.CSTNode  # where the scaler is used (for visibility checks)


@dataclasses.dataclass
class Binding:
    """A binding the codemod adds (`amp_dtype`, `scaler`): where, and its text."""

    kind: str  # "name" or "attr"
    name: str
    after: cst.BaseStatement
    owner: Optional[str]  # the `self` parameter, for attributes
    value: str
    exists: bool = False  # already there (a previous run)
    used: bool = False  # something committed refers to it
    before: bool = False  # goes before `after` (the first statement of a function) instead
    spaced: bool = False  # a blank line above it (after the module's imports)
    passed: list = dataclasses.field(default_factory=list)  # kind "param": (call, caller's scaler key, the Ref it passes)
    optional: bool = False  # kind "param": after defaulted parameters, so it defaults to None

    def text(self, owner: Optional[str]) -> str:
        return f"{owner}.{self.name}" if self.kind == "attr" else self.name


@dataclasses.dataclass
class ApexEdit:
    """One apex call migrated: the call replaced, or its line removed or swapped."""

    call: cst.Call
    message: str
    replace: Optional[Callable] = None  # updated call -> new expression
    line: Optional[cst.SimpleStatementLine] = None  # removed, unless `swap` gives its replacement
    swap: Optional[Callable] = None


class Problem(Exception):
    """A reason not to migrate: where, the code and the manual step."""

    def __init__(self, node: cst.CSTNode, code: str, message: str) -> None:
        super().__init__(message)
        self.node, self.code, self.message = node, code, message
