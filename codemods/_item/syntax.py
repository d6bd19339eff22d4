"""What the `item` codemod knows of the syntax, without the script model:
the tensor methods and torch functions that keep, drop or read a loss's
values, what a later use needs of them (`Need`, `Verdict`), a `Store`, and
small helpers over expressions."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterator, Optional

import libcst as cst

from .._base import code_of, walk

# Tensor methods whose result is the same values, still attached to the graph.
SAME_VALUE_METHODS = frozenset(
    {"float", "double", "half", "bfloat16", "to", "cpu", "cuda", "clone", "contiguous", "squeeze"}
)
# Methods and attributes that give values without a graph.
DETACHING_METHODS = frozenset({"item", "detach", "tolist", "numpy"})
DETACHING_ATTRIBUTES = frozenset({"data"})
# Reductions that give a 0-d tensor when called without arguments.
REDUCTIONS = frozenset({"mean", "sum"})
# `scaler.scale(loss)` (GradScaler), `amp.scale_loss(loss, optimizer)` (apex).
SCALING_METHODS = frozenset({"scale", "scale_loss"})

# Methods of the accumulator that store into it (the store itself) ...
STORING_METHODS = frozenset({"append", "insert", "extend", "add", "appendleft"})
# ... that mutate it without reading its values ...
MUTATING_METHODS = frozenset(
    {"append", "insert", "extend", "add", "appendleft", "clear", "remove", "reverse", "sort", "discard", "setdefault"}
)
# ... that give its elements or a copy of them ...
ELEMENT_METHODS = frozenset({"pop", "popleft", "get", "values", "items", "copy"})
# ... and that read nothing of its values.
SHAPE_METHODS = frozenset({"keys", "index", "count", "__len__"})
# Uses that need the graph.
AUTOGRAD_ATTRIBUTES = frozenset(
    {"backward", "grad", "grad_fn", "requires_grad", "requires_grad_", "register_hook", "retain_grad"}
)
# Tensor attributes that read metadata or detached values only.
TENSOR_FACTS = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "data"})
# Methods, on whatever object, that only log or format the numbers they get.
LOGGING_METHODS = frozenset(
    {
        "info", "debug", "warning", "warn", "error", "critical", "exception", "log", "format",
        "add_scalar", "add_scalars", "log_metric", "log_metrics", "log_dict",
        "set_postfix", "set_postfix_str", "set_description",
    }
)  # fmt: skip

BUILTIN_NUMBER_SINKS = frozenset(
    {f"builtins.{n}" for n in ("print", "str", "repr", "float", "int", "round", "abs", "bool", "format")}
)
BUILTIN_SHAPE_ONLY = frozenset({"builtins.len", "builtins.isinstance", "builtins.id", "builtins.type"})
# Builtins whose result carries the values they were given.
BUILTIN_CARRIERS = frozenset(
    {
        f"builtins.{n}"
        for n in (
            "sum",
            "min",
            "max",
            "sorted",
            "list",
            "tuple",
            "reversed",
            "enumerate",
            "zip",
            "iter",
            "next",
            "dict",
            "set",
        )
    }
)
NUMBER_MODULES = ("numpy.", "math.", "statistics.", "logging.", "matplotlib.", "wandb.", "mlflow.", "json.", "pandas.")
AUTOGRAD_CALLS = frozenset({"torch.autograd.backward", "torch.autograd.grad"})
STACKING_CALLS = frozenset(
    {"torch.stack", "torch.cat", "torch.concat", "torch.concatenate", "torch.vstack", "torch.hstack", "builtins.sum"}
)
TENSOR_REDUCING_CALLS = frozenset({"torch.sum", "torch.mean"})

# Assigned values that make a new object nobody else references.
FRESH_CALLS = frozenset(
    {
        "builtins.list", "builtins.dict", "builtins.set", "builtins.float", "builtins.int",
        "collections.defaultdict", "collections.OrderedDict", "collections.deque",
        "torch.zeros", "torch.zeros_like", "torch.tensor", "torch.empty", "torch.ones",
        "numpy.zeros", "numpy.ones", "numpy.empty", "numpy.full",
    }
)  # fmt: skip

# Calls that give numbers, not tensors.
NUMBER_METHODS = frozenset({"item", "tolist", "size", "numel", "dim", "__len__", "count", "index"})
NUMBER_FUNCTIONS = frozenset(
    {f"builtins.{n}" for n in ("len", "float", "int", "round", "abs", "min", "max", "sum", "bool", "range")}
)

# How a name takes part in a backpropagated expression.
TENSOR_ROOT = "tensor"  # it is the tensor (`loss.backward()`, `scaler.scale(loss)`)
OPERAND_ROOT = "operand"  # an operand of arithmetic, which may be a plain number (`loss * weight`)
LIST_ROOT = "list"  # a list of tensors stacked or summed (`torch.stack(losses)`)

Expression = cst.BaseExpression
# An accumulator: ("name", scope, name) for a variable, ("attr", name) for an attribute, ("other", code).
AccumulatorKey = tuple


class Need(enum.IntEnum):
    """What later code needs of the stored values; the strongest use wins."""

    NONE = 0  # nothing of the values (len, append, reset)
    NUMBER = 1  # reads them as numbers: a float serves as well as a tensor
    TENSOR = 2  # calls tensor methods or torch functions on them
    UNKNOWN = 3  # they go where this codemod cannot follow
    GRAPH = 4  # they are backpropagated later: the graph must stay


@dataclass(frozen=True)
class Verdict:
    need: Need
    why: str = ""  # for UNKNOWN: where the values go

    def __or__(self, other: "Verdict") -> "Verdict":
        return other if other.need > self.need else self


NOTHING = Verdict(Need.NONE)
NUMBER = Verdict(Need.NUMBER)
TENSOR = Verdict(Need.TENSOR)
GRAPH = Verdict(Need.GRAPH)


def unknown(why: str) -> Verdict:
    return Verdict(Need.UNKNOWN, why)


def method_name(call: cst.Call) -> Optional[str]:
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None


def positional_args(call: cst.Call) -> list[cst.Arg]:
    return [arg for arg in call.args if arg.keyword is None and not arg.star]


def is_number_literal(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.UnaryOperation):
        return is_number_literal(node.expression)
    return isinstance(node, (cst.Integer, cst.Float)) or (isinstance(node, cst.Name) and node.value == "None")


def is_detaching(node: cst.CSTNode) -> bool:
    """`x.item()`, `x.detach()`, `x.data`, `x.data[0]`: no graph in the result."""
    if isinstance(node, cst.Attribute):
        return node.attr.value in DETACHING_ATTRIBUTES
    if isinstance(node, cst.Call):
        return method_name(node) in DETACHING_METHODS
    if isinstance(node, cst.Subscript):
        return is_detaching(node.value)
    return False


def assigned_value(target: cst.CSTNode, statement: cst.CSTNode) -> Optional[Expression]:
    """The value a plain `target = value` (or `with value as target`) gives."""
    if isinstance(statement, (cst.Assign, cst.AnnAssign)):
        return statement.value
    if isinstance(statement, cst.WithItem):
        return statement.item
    return None


@dataclass
class Store:
    """One statement that puts loss values into an accumulator."""

    node: cst.CSTNode  # the statement (or call) reported
    target: Expression  # the accumulator as written: `losses`, `self.losses`, `history[k]`
    values: list[Expression] = field(default_factory=list)  # what is stored
    atoms: list[tuple[Expression, bool]] = field(default_factory=list)  # (loss expression, known 0-d)
    opaque: bool = False  # a loss reaches it through something not modelled
    is_update: bool = False  # `meter.update(loss, n)`
    carried: list = field(default_factory=list)  # targets of the literals it stores through a name (`log = {...}`)


def always_run(block: cst.BaseSuite) -> Iterator[cst.BaseSmallStatement]:
    """The small statements a block runs every time it runs (those in `with`
    and `try` bodies included, not those behind a condition or a loop)."""
    for statement in getattr(block, "body", ()):
        if isinstance(statement, cst.SimpleStatementLine):
            yield from statement.body
        elif isinstance(statement, cst.BaseSmallStatement):
            yield statement
        elif isinstance(statement, (cst.With, cst.Try)):
            yield from always_run(statement.body)


def first_line(node: Optional[cst.CSTNode]) -> str:
    text = code_of(node).strip().splitlines()[0] if node is not None else "?"
    return text if len(text) <= 60 else text[:57] + "..."


def keyword(call: cst.Call, name: str) -> Optional[cst.Arg]:
    return next((arg for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def names_in(node: cst.CSTNode) -> Iterator[cst.Name]:
    return (n for n in walk(node) if isinstance(n, cst.Name))


def accumulator_mentions(value: cst.CSTNode) -> list[Expression]:
    """The names and attributes a value reads (`running` in `running + loss`)."""
    mentions = []
    for node in walk(value):
        if isinstance(node, (cst.Name, cst.Attribute)):
            mentions.append(node)
    return mentions


def arithmetic_parts(value: Expression) -> Optional[list[Expression]]:
    """The operands of arithmetic and the items of literals, which carry the
    values of their parts unchanged; None for anything else."""
    if isinstance(value, cst.BinaryOperation) and not isinstance(value.operator, cst.MatrixMultiply):
        return [value.left, value.right]
    if isinstance(value, cst.UnaryOperation):
        return [value.expression]
    if isinstance(value, (cst.List, cst.Tuple, cst.Set)):
        return [element.value for element in value.elements]
    if isinstance(value, cst.Dict):
        return [element.value for element in value.elements if isinstance(element, cst.DictElement)]
    if isinstance(value, cst.IfExp):
        return [value.body, value.orelse]
    return None


def only_atoms_and_numbers(value: Expression, atoms: set) -> bool:
    if value in atoms or is_number_literal(value):
        return True
    if isinstance(value, cst.BinaryOperation):
        return only_atoms_and_numbers(value.left, atoms) and only_atoms_and_numbers(value.right, atoms)
    if isinstance(value, cst.UnaryOperation):
        return only_atoms_and_numbers(value.expression, atoms)
    return False
