"""Running totals of a loop over the data, and how several processes' totals
make the one-process total.

A running total is a plain name that a statement just before the loop sets to
zero (`total = 0.0`, `correct = seen = 0`, `loss_sum, n = 0.0, 0`), that the
loop only adds to (`total += loss.item()`), and that code after the loop
reads (`print(total / len(loader))`, `return correct / seen`). When each
process runs the loop over its share of every batch, what it adds decides
how the processes' totals combine into the one the single process had:

- a per-batch mean (the loss a criterion averages over the batch, or the loss
  `backward()` is called on when nothing in the file says how it is reduced,
  as DDP's averaged gradients assume; a batch's accuracy `(p == y).float()
  .mean()`): each process adds one mean per batch, over its share, so the
  single process's total is the processes' totals averaged (MEAN_PER_BATCH);
- a sum over the batch's samples or a count (`loss.item() * x.size(0)`,
  `(pred == y).sum().item()`, `y.size(0)`, `len(y)`, a loss summed over the
  batch): the processes' totals added up (SUM_OVER_SAMPLES).

A total whose additions are of neither kind, or of both, is not one (it is
left as it is). Its `python_type` is "int" or "float" where every addition is
a Python number (`.item()`, `float(...)`, `len(...)`, `.size(0)`,
`.shape[0]`; an int where it starts from an int and adds sizes and counts),
None where it may be a tensor. `.item()`, `.detach()`, `.cpu()`, `.data`, `float(...)` and
the old `loss.data[0]` keep what they read.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst

from .._syntax import dotted_name, walk
from .model import ScriptModel
from .reduction import BATCH, MEAN, SUM, backpropagated, backward_reduction, reads_as
from .uses import uses_of

MEAN_PER_BATCH, SUM_OVER_SAMPLES = "mean per batch", "sum over samples"
_SIZE = "size"  # the batch's size: a count of samples (a sum)
_KEEPING = frozenset({"item", "detach", "cpu", "float", "double"})  # methods that keep what they read
_CASTS = frozenset({"float", "double", "int", "long", "half"})
_MATCHES = frozenset({"eq", "ne"})


@dataclasses.dataclass(frozen=True)
class RunningTotal:
    name: str
    kind: str  # MEAN_PER_BATCH or SUM_OVER_SAMPLES
    reset: cst.CSTNode = dataclasses.field(repr=False)  # the statement that sets it to zero
    python_type: Optional[str] = None  # "int", "float", or None: it may be a tensor


def running_totals(script: ScriptModel, loop: cst.For) -> list[RunningTotal]:
    """The running totals of `loop`, in the order the loop first adds to them."""
    before = _statements_before(script, loop)
    additions, written = _additions(loop)
    losses = _backpropagated(script, loop)
    found = []
    for name, values in additions.items():
        if name in written:
            continue
        reset = _reset(before, name)
        kinds = {_kind(script, value, loop, losses) for value in values}
        if reset is None or len(kinds) != 1 or None in kinds or not _read_after(script, loop, name):
            continue
        types = {_python_type(script, value) for value in values} | {_literal_type(reset, name)}
        python_type = None if None in types else "float" if "float" in types else "int"
        found.append(RunningTotal(name, kinds.pop(), reset, python_type))
    return found


def _statements_before(script: ScriptModel, loop: cst.For) -> list[cst.CSTNode]:
    """The statements that run just before the loop, nearest last: those above
    it in its block, and above the `with` blocks around it (`with tqdm(...)
    as bar:`), which run once each time the loop does."""
    found: list[cst.CSTNode] = []
    statement = loop
    while True:
        block = script.parent(statement)
        statements = list(getattr(block, "body", ()))
        if statement not in statements:
            return found
        found = statements[: statements.index(statement)] + found
        owner = script.parent(block)
        if not isinstance(owner, cst.With) or not isinstance(block, cst.IndentedBlock):
            return found
        found.insert(0, owner.with_changes(body=cst.IndentedBlock(body=[])))  # its items may bind the name
        statement = owner


def _python_type(script: ScriptModel, value: cst.BaseExpression) -> Optional[str]:
    """"int" or "float" for an addition that is a Python number, else None."""
    if isinstance(value, cst.BinaryOperation):
        sides = {_python_type(script, value.left), _python_type(script, value.right)}
        return None if None in sides else "float" if "float" in sides or isinstance(value.operator, cst.Divide) else "int"
    if isinstance(value, cst.Call) and script.is_call_to(value, {"builtins.float"}):
        return "float"
    if isinstance(value, cst.Call) and script.is_call_to(value, {"builtins.len", "builtins.int"}):
        return "int"
    if isinstance(value, cst.Subscript) or (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "size" and value.args):
        return "int"  # `x.shape[0]`, `x.size(0)`
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "item" and not value.args:
        counted = _counted_matches(script, value.func.value)
        return "int" if counted == SUM and not _cast_to_float(value.func.value) else "float"
    return None


def _cast_to_float(node: cst.BaseExpression) -> bool:
    return any(isinstance(n, cst.Attribute) and n.attr.value in ("float", "double", "half") for n in walk(node))


def _literal_type(reset: cst.SimpleStatementLine, name: str) -> str:
    return "float" if isinstance(_zero_for(reset.body[0], name), cst.Float) else "int"


def _additions(loop: cst.For) -> tuple[dict[str, list[cst.BaseExpression]], set[str]]:
    """The values the loop body adds to each name (`name += value`), and the
    names it binds in any other way."""
    additions: dict[str, list[cst.BaseExpression]] = {}
    written: set[str] = set()
    for node in walk(loop.body, into_definitions=False):
        if isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
            if isinstance(node.operator, cst.AddAssign):
                additions.setdefault(node.target.value, []).append(node.value)
            else:
                written.add(node.target.value)
        else:
            written.update(_bound_names(node))
    written.update(_bound_names(loop))
    return additions, written


def _bound_names(node: cst.CSTNode) -> set[str]:
    targets: list[cst.CSTNode] = []
    if isinstance(node, cst.Assign):
        targets = [t.target for t in node.targets]
    elif isinstance(node, (cst.AnnAssign, cst.For)):
        targets = [node.target]
    elif isinstance(node, cst.AsName):
        targets = [node.name]
    elif isinstance(node, cst.NamedExpr):
        targets = [node.target]
    elif isinstance(node, cst.Del):
        targets = [node.target]
    return {n.value for target in targets for n in walk(target) if isinstance(n, cst.Name)}


def _reset(before: list[cst.CSTNode], name: str) -> Optional[cst.SimpleStatementLine]:
    """The statement among those just before the loop that last sets `name`,
    when it sets it to zero and nothing between binds it again."""
    for statement in reversed(before):
        if not any(name in _bound_names(n) or _adds_to(n, name) for n in walk(statement, into_definitions=False)):
            continue
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            return statement if _zero_for(statement.body[0], name) is not None else None
        return None
    return None


def _adds_to(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name) and node.target.value == name


def _zero_for(assign: cst.BaseSmallStatement, name: str) -> Optional[cst.BaseExpression]:
    """The zero `name` is set to: `name = 0`, `a = name = 0.0`, `a, name = 0.0, 0`."""
    if not isinstance(assign, cst.Assign):
        return None
    for target in assign.targets:
        if isinstance(target.target, cst.Name) and target.target.value == name:
            return assign.value if _is_zero(assign.value) else None
        if isinstance(target.target, cst.Tuple) and isinstance(assign.value, cst.Tuple):
            names, values = target.target.elements, assign.value.elements
            for n, v in zip(names, values) if len(names) == len(values) else ():
                if isinstance(n.value, cst.Name) and n.value.value == name:
                    return v.value if _is_zero(v.value) else None
    return None


def _is_zero(node: cst.BaseExpression) -> bool:
    return isinstance(node, (cst.Integer, cst.Float)) and float(node.evaluated_value) == 0


def _read_after(script: ScriptModel, loop: cst.For, name: str) -> bool:
    end = script.line.range(loop).end.line
    scope = script.scope_of(loop)
    return any(script.line(read) > end for read in uses_of(script).reads(name, scope))


def _backpropagated(script: ScriptModel, loop: cst.For) -> dict[str, Optional[str]]:
    """The names the loop's backward calls differentiate, with their reduction."""
    found = {}
    for call in uses_of(script).backward_calls:
        if loop in script.ancestors(call):
            operand = backpropagated(call)
            if isinstance(operand, cst.Name):
                found[operand.value] = backward_reduction(script, call)
    return found


def _kind(script: ScriptModel, value: cst.BaseExpression, loop: cst.For, losses: dict) -> Optional[str]:
    found = _quantity(script, value, loop, losses)
    return {MEAN: MEAN_PER_BATCH, SUM: SUM_OVER_SAMPLES, _SIZE: SUM_OVER_SAMPLES}.get(found or "")


def _quantity(script: ScriptModel, node: cst.BaseExpression, loop: cst.For, losses: dict) -> Optional[str]:
    """MEAN (a per-batch mean), SUM (a sum over samples), _SIZE (a count of
    samples), or None."""
    node = _kept(script, node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        sides = {_quantity(script, node.left, loop, losses), _quantity(script, node.right, loop, losses)}
        return SUM if sides == {MEAN, _SIZE} else None  # a batch's mean times its size
    if _is_length_of_batch(script, node, loop):
        return _SIZE
    counted = _counted_matches(script, node)
    if counted is not None:
        return counted
    if isinstance(node, cst.Name) and node.value in losses:
        reduction = losses[node.value]
        return reduction if reduction in (MEAN, SUM) else (MEAN if reduction is None else None)
    found = reads_as(script, node)
    return {MEAN: MEAN, SUM: SUM, BATCH: _SIZE}.get(found or "")


def _kept(script: ScriptModel, node: cst.BaseExpression) -> cst.BaseExpression:
    """`node` without what keeps its value: `.item()`, `.detach()`,
    `.data`, `float(...)`, `.data[0]`."""
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _KEEPING and not node.args:
            node = node.func.value
        elif isinstance(node, cst.Call) and len(node.args) == 1 and script.is_call_to(node, {"builtins.float"}):
            node = node.args[0].value
        elif isinstance(node, cst.Attribute) and node.attr.value == "data":
            node = node.value
        elif isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute) and node.value.attr.value == "data":
            node = node.value.value  # `loss.data[0]`, a scalar's value before torch 0.4
        else:
            return node


def _is_length_of_batch(script: ScriptModel, node: cst.BaseExpression, loop: cst.For) -> bool:
    """`len(y)` of a name the loop binds (its batch, or what it computes from it)."""
    if not (isinstance(node, cst.Call) and len(node.args) == 1 and script.is_call_to(node, {"builtins.len"})):
        return False
    measured = node.args[0].value
    if not isinstance(measured, cst.Name):
        return False
    bindings = script.bindings_of_reference(measured)
    return bool(bindings) and all(b.statement is loop or loop in script.ancestors(b.node) for b in bindings)


def _counted_matches(script: ScriptModel, node: cst.BaseExpression) -> Optional[str]:
    """`(pred == y).sum()`, `pred.eq(y).sum()`, `torch.sum(pred == y)`: a count
    of the batch's matches (SUM); their `.float().mean()`, a batch's rate (MEAN)."""
    if not isinstance(node, cst.Call):
        return None
    if isinstance(node.func, cst.Attribute) and node.func.attr.value in ("sum", "mean") and not node.args:
        reduction, operand = node.func.attr.value, node.func.value
    elif script.is_call_to(node, {"torch.sum", "torch.mean"}) and len(node.args) == 1 and not node.args[0].keyword:
        reduction, operand = dotted_name(node.func).rpartition(".")[2], node.args[0].value
    else:
        return None
    while isinstance(operand, cst.Call) and isinstance(operand.func, cst.Attribute) and operand.func.attr.value in _CASTS and not operand.args:
        operand = operand.func.value
    is_match = isinstance(operand, cst.Comparison) or (
        isinstance(operand, cst.Call) and isinstance(operand.func, cst.Attribute) and operand.func.attr.value in _MATCHES
    )
    if not is_match:
        return None
    return SUM if reduction == "sum" else MEAN
