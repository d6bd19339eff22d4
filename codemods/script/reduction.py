"""How the loss that reaches `backward()` is reduced over the batch: a mean or a sum.

Gradient accumulation and data parallelism both rebuild the big batch's
gradient from the gradients of parts of it. A mean over the batch must then be
averaged (divided by the number of parts), a sum added up as it is. This
module answers which one a script's loss is, by meaning:

- torch's losses: a criterion class (`nn.CrossEntropyLoss(reduction="sum")`,
  the old `size_average=False`) followed from its binding to its call
  (`criterion(out, y)`, through `self.criterion`, `.to(device)` and the
  parameters the file passes it), a functional loss (`F.nll_loss(...)`),
  `reduction="batchmean"` (a mean), a class of the file whose `forward`
  returns one;
- tensor reductions: `.mean()`, `.sum()`, `torch.mean(x)`, `torch.sum(x)`
  of a per-sample tensor (a model's output, a batch, arithmetic on them);
  with a `dim` they reduce part of a tensor and leave it per-sample;
- arithmetic: sums and differences of terms that agree, a loss scaled by a
  constant (a number, a data set's length) keeps its reduction, a sum
  divided by the batch's size (`x.size(0)`, `len(x)`, the loader's
  `batch_size`) is a mean; names followed to what the file assigns them
  (`loss += ...` included), functions of the file (and lambdas) to what
  they return, a `reduction=` name to the string the file binds it to;
- a term computed from the model's parameters alone (a weight penalty
  summed over `for p in model.parameters()`) is the same on every rank and
  in every part of a batch: beside a loss, it leaves the loss's reduction;
- Python's `sum(...)` of losses: of terms written out (`sum([a, b])`), their
  sum; of terms a loop makes (`sum(F.mse_loss(o, t) for o, t in zip(out,
  y))`) or a list collects (`sum(losses)`), UNCLEAR unless the loop ranges
  over constants: it may run over the batch's samples (a sum over the
  batch, each term a sample's) or over a model's heads (a mean still).

The answer is MEAN, SUM, UNCLEAR (something in the file decides the
reduction but cannot be read: `reduction=args.reduction`, a sum scaled by a
value the file does not show, a mean added to a sum) or None (nothing in the
file says: `loss = model(x, y)`, `outputs.loss`). None is never read as
either: the codemods decide what it means for them.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import libcst as cst

from .._syntax import dotted_name, has_star_args, keyword_arg, walk
from .._modernize.loss_arguments import FUNCTIONAL_LOSSES, LOSS_CLASSES
from .._modernize.syntax import literal_flag
from . import vocabulary as v
from .model import ScriptModel
from .scopes import Binding

MEAN, SUM, UNCLEAR = "mean", "sum", "unclear"
# What the reading meets besides MEAN, SUM and UNCLEAR (internal): a tensor
# with a value per sample, a number that does not depend on the batch, the
# batch's size, a DataLoader's data set (whose length is a constant), a value
# computed from the model's parameters alone, and a criterion object that
# reduces as it says.
PER_SAMPLE, CONSTANT, BATCH, DATASET, WEIGHTS = "per-sample", "constant", "batch size", "data set", "weights"
CRITERION = "criterion:"
LOSSES = (MEAN, SUM)
REDUCTIONS = {"mean": MEAN, "batchmean": MEAN, "sum": SUM, "none": PER_SAMPLE}
# Tensor methods (and torch functions) that keep a value per sample.
ELEMENTWISE = frozenset(
    {"abs", "clamp", "clip", "contiguous", "cpu", "cuda", "double", "exp", "flatten", "float", "half", "log",
     "log_softmax", "neg", "permute", "pow", "relu", "reshape", "sigmoid", "softmax", "sqrt", "square", "squeeze",
     "tanh", "to", "transpose", "unsqueeze", "view"}
)  # fmt: skip
TORCH_REDUCTIONS = {"torch.mean": MEAN, "torch.sum": SUM}
DEPTH = 12  # names, parameters and functions followed before giving up


def backpropagated(backward: cst.Call) -> Optional[cst.BaseExpression]:
    """What `backward` differentiates: `loss` of `loss.backward()` and of a
    gradient scaler's `scaler.scale(loss).backward()`, `loss / n` of
    `(loss / n).backward()`; None for a call that is no method call."""
    if not isinstance(backward.func, cst.Attribute):
        return None
    operand = backward.func.value
    if _method(operand) == "scale" and len(operand.args) == 1 and not operand.args[0].keyword:
        return operand.args[0].value
    return operand


def through_scaler(backward: cst.Call) -> bool:
    """`scaler.scale(loss).backward()`: the backward of a gradient scaler's scaled loss."""
    return isinstance(backward.func, cst.Attribute) and backpropagated(backward) is not backward.func.value


def backward_reduction(script: ScriptModel, backward: cst.Call) -> Optional[str]:
    """The reduction of what `backward` differentiates (`backpropagated`)."""
    operand = backpropagated(backward)
    return None if operand is None else loss_reduction(script, operand)


def loss_reduction(script: ScriptModel, expression: cst.BaseExpression) -> Optional[str]:
    """MEAN, SUM, UNCLEAR or None for a loss expression (see the module's docstring)."""
    found = script.derived(_Reading).value(expression, {}, 0)
    return found if found in (MEAN, SUM, UNCLEAR) else None


def sums_or_unclear(script: ScriptModel, expression: cst.BaseExpression) -> bool:
    """A loss, or a criterion (`nn.MSELoss(reduction="sum")`, handed to a loop
    in another module), that sums over the batch or whose reduction cannot be read."""
    found = reads_as(script, expression) or ""
    return found.removeprefix(CRITERION) in (SUM, UNCLEAR, "?")


def reads_as(script: ScriptModel, expression: cst.BaseExpression) -> Optional[str]:
    """What the reading finds `expression` to be: MEAN, SUM, UNCLEAR, or one
    of the internal values (PER_SAMPLE, CONSTANT, BATCH, ...); None if nothing."""
    return script.derived(_Reading).value(expression, {}, 0)


def training_reductions(script: ScriptModel, model: str) -> set:
    """The reductions of the losses that the training steps training `model`
    (as bound: "model", "self.net"; every step of the file when none names
    it so, as where the model reaches training under another name)
    backpropagate: {SUM} where each sums over the batch."""
    steps = [s for s in script.training_steps if model in s.model_names] or script.training_steps
    return {backward_reduction(script, s.backward) for s in steps}


class _Reading:
    """The reading of one script: what each name holds, found once (a flat
    script that repeats a block thousands of times stays linear), and the
    names and functions being read (against cycles)."""

    def __init__(self, script: ScriptModel) -> None:
        self.script = script
        self.index = script.index
        self._open: set[int] = set()
        self._held: dict[tuple[int, str], Optional[str]] = {}
        self._sizes: Optional[set[str]] = None

    def value(self, node: cst.BaseExpression, env: dict, depth: int) -> Optional[str]:
        if depth > DEPTH:
            return None
        if isinstance(node, (cst.Integer, cst.Float)):
            return CONSTANT
        if isinstance(node, (cst.Name, cst.Attribute)):
            return self._reference(node, env, depth)
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
            return self.value(node.expression, env, depth + 1)
        if isinstance(node, cst.BinaryOperation):
            left, right = self.value(node.left, env, depth + 1), self.value(node.right, env, depth + 1)
            return _arithmetic(node.operator, self._factor(node.left, left), self._factor(node.right, right))
        if isinstance(node, cst.IfExp):
            return _alternatives([self.value(node.body, env, depth + 1), self.value(node.orelse, env, depth + 1)])
        if isinstance(node, cst.Subscript):
            return self._subscript(node, env, depth)
        if isinstance(node, cst.Call):
            return self._call(node, env, depth)
        if isinstance(node, cst.Lambda):  # a criterion written inline: what its body computes
            return CRITERION + (self.value(node.body, env, depth + 1) or "?")
        return None

    # -- names ---------------------------------------------------------------------------

    def _reference(self, node: cst.BaseExpression, env: dict, depth: int) -> Optional[str]:
        spelled = dotted_name(node)
        if spelled in env:
            return env[spelled]
        if isinstance(node, cst.Attribute) and node.attr.value == "dataset":
            return DATASET  # a DataLoader's (a batch has none)
        bindings = self.script.bindings_of_reference(node)
        if not bindings or not spelled:
            return None
        key = (id(bindings[0]), spelled)
        if key in self._held:
            return self._held[key]
        if id(bindings[0]) in self._open:
            return None
        self._open.add(id(bindings[0]))
        try:
            found = self._held[key] = self._bound(spelled, bindings, depth)
        finally:
            self._open.discard(id(bindings[0]))
        return found

    def _bound(self, name: str, bindings: list[Binding], depth: int) -> Optional[str]:
        """What `name` holds, from all of its bindings: the values assigned
        are alternatives; an assignment that reads the name (`loss = loss / n`,
        `loss += term`) changes the value it had."""
        alternatives, changes = [], []
        for binding in bindings:
            change = _change_of(binding, name)
            if change is not None:
                changes.append(change)
            else:
                alternatives.append(self._binding(binding, depth))
        current = _alternatives(alternatives)
        for _ in range(3):  # the lattice is small: a few rounds reach the fixed point
            changed = _alternatives([current, *(self.value(c, {name: current}, depth + 1) for c in changes)])
            if changed == current:
                break
            current = changed
        return current

    def _binding(self, binding: Binding, depth: int) -> Optional[str]:
        if binding.kind in ("assign", "named", "with") and binding.value is not None:
            return self.value(binding.value, {}, depth + 1)
        if binding.kind == "assign" and isinstance(binding.statement, cst.Assign):  # unpacking
            return PER_SAMPLE if self.value(binding.statement.value, {}, depth + 1) == PER_SAMPLE else None
        if binding.kind == "for" and isinstance(binding.statement, cst.For):
            if _method(binding.statement.iter) == "parameters" and isinstance(binding.statement.target, cst.Name):
                return WEIGHTS  # `for theta in model.parameters():`
            return PER_SAMPLE if self._iterates_loader(binding.statement.iter) else None
        if binding.kind == "param":
            return self._parameter(binding, depth)
        return None

    def _iterates_loader(self, iterable: cst.BaseExpression) -> bool:
        while isinstance(iterable, cst.Call) and _positional(iterable):
            iterable = _positional(iterable)[0]
        return self.script.kind_of(iterable) == "loader"

    def _parameter(self, binding: Binding, depth: int) -> Optional[str]:
        function = self.script.flow.functions.get(binding.scope.node)
        sites = function.callers if function is not None else []
        passed = [site.arguments.get(binding.name) for site in sites]
        if not passed or any(argument is None for argument in passed):
            return None
        return _alternatives([self.value(argument, {}, depth + 1) for argument in passed])

    # -- calls ----------------------------------------------------------------------------

    def _call(self, call: cst.Call, env: dict, depth: int) -> Optional[str]:
        names = self.script.qualified_names(call.func)
        declared = self._torch_loss(call, names)
        if declared is not None:
            return declared
        reducing = _reduction_call(call, names)
        if reducing is not None:
            reduction, operand = reducing
            if operand is None:
                return PER_SAMPLE  # over some dimensions only
            return _reduced(reduction, operand, self.value(operand, env, depth + 1))
        method = _method(call)
        if method == "size" and len(call.args) == 1 and _is_zero(call.args[0].value):
            return BATCH
        if "builtins.len" in names and len(call.args) == 1:
            return self._length(call.args[0].value, env, depth)
        if method in ELEMENTWISE or any(n.rpartition(".")[2] in ELEMENTWISE for n in names if n.startswith("torch.")):
            operand = call.func.value if method in ELEMENTWISE else (_positional(call)[0] if _positional(call) else None)
            inner = self.value(operand, env, depth + 1) if operand is not None else None
            return inner if inner in (PER_SAMPLE, MEAN, SUM, WEIGHTS) or (inner or "").startswith(CRITERION) else None
        if names & {"builtins.float", "builtins.int"} and len(call.args) == 1:
            return CONSTANT if self.value(call.args[0].value, env, depth + 1) == CONSTANT else None
        if "builtins.sum" in names and _positional(call) and not has_star_args(call):
            return self._builtin_sum(_positional(call)[0], env, depth)
        called = self._called(call, depth)
        if called is None and self.script.kind_of(call.func) == "model":
            return PER_SAMPLE  # a model's output
        return called

    def _builtin_sum(self, summed: cst.BaseExpression, env: dict, depth: int) -> Optional[str]:
        """Python's `sum(...)` (see the module's docstring)."""
        if isinstance(summed, (cst.List, cst.Tuple)):
            terms = [self.value(e.value, env, depth + 1) for e in summed.elements if not isinstance(e, cst.StarredElement)]
            if not terms or len(terms) != len(summed.elements):
                return None
            total = terms[0]
            for term in terms[1:]:
                total = _added(total, term)
            return total
        if isinstance(summed, (cst.GeneratorExp, cst.ListComp)):
            term = self.value(summed.elt, env, depth + 1)
            if term in LOSSES or term == UNCLEAR:
                fixed = all(self._fixed_range(clause.iter, env, depth) for clause in _clauses(summed.for_in))
                return term if fixed else UNCLEAR
            return None
        if isinstance(summed, cst.Name):
            collected, listed = self._collected(summed, depth), self._listed(summed, env, depth)
            if listed and None not in listed and not collected:
                return _alternatives(listed)  # the list as written: `losses = [a, b]`
            if any(value in LOSSES or value == UNCLEAR for value in collected + listed):
                return UNCLEAR
        return None

    def _listed(self, name: cst.Name, env: dict, depth: int) -> list:
        """What `sum(name)` adds where the file binds `name` to a list it
        writes out or a comprehension (`losses = [f(o, t) for ...]`)."""
        return [
            self._builtin_sum(binding.value, env, depth + 1)
            for binding in self.script.bindings_of_reference(name)
            if binding.kind == "assign" and isinstance(binding.value, (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp))
        ]

    def _fixed_range(self, iterable: cst.BaseExpression, env: dict, depth: int) -> bool:
        """`range(3)`, `range(len(heads))` of constants, or a literal list of
        names: a loop over those runs over no batch."""
        if isinstance(iterable, (cst.List, cst.Tuple)):
            return True
        if isinstance(iterable, cst.Call) and "builtins.range" in self.script.qualified_names(iterable.func):
            return all(self.value(a.value, env, depth + 1) == CONSTANT for a in iterable.args)
        return False

    def _collected(self, name: cst.Name, depth: int) -> list:
        """What the code appends to the list `name` where it binds it."""
        found = []
        for binding in self.script.bindings_of_reference(name):
            for node in walk(binding.scope.node, into_definitions=False):
                if _method(node) == "append" and dotted_name(node.func.value) == name.value and len(node.args) == 1:
                    found.append(self.value(node.args[0].value, {}, depth + 1))
        return found

    def _torch_loss(self, call: cst.Call, names: Iterable[str]) -> Optional[str]:
        """The reduction a torch loss function computes, or a loss class builds."""
        if not dotted_name(call.func):
            return None  # `nn.MSELoss()(out, y)` calls the loss it makes
        for qualified in names:
            module, _, last = qualified.rpartition(".")
            if module == "torch.nn.functional" and last in FUNCTIONAL_LOSSES:
                return _declared(call, FUNCTIONAL_LOSSES[last], self._string)
            if v.is_loss_class(qualified):
                return CRITERION + (_declared(call, LOSS_CLASSES[last], self._string) if last in LOSS_CLASSES else UNCLEAR)
        return None

    def _string(self, node: cst.BaseExpression) -> Optional[str]:
        """The string `node` is: a literal, or a name the file binds once to one (`RED = "sum"`)."""
        if isinstance(node, cst.SimpleString):
            return node.evaluated_value
        bindings = self.script.bindings_of_reference(node) if isinstance(node, cst.Name) else []
        if len(bindings) == 1 and bindings[0].kind == "assign" and isinstance(bindings[0].value, cst.SimpleString):
            return bindings[0].value.evaluated_value
        return None

    def _called(self, call: cst.Call, depth: int) -> Optional[str]:
        """A criterion's call, the file's class made into a criterion, or what a
        function of the file returns."""
        made = self._file_class(call)
        if made is not None:
            forward = self.script.flow.method(made, "forward")
            return CRITERION + (self._returned(forward.node, depth) or "?") if forward is not None else None
        callee = self.value(call.func, {}, depth + 1)
        if callee is not None and callee.startswith(CRITERION):
            inner = callee[len(CRITERION):]
            return inner if inner in (MEAN, SUM, UNCLEAR, PER_SAMPLE) else None
        found = self.script.flow.callee(call, self.script.scope_of(call))
        if found is not None and not found[1]:
            return self._returned(found[0].node, depth)
        return None

    def _file_class(self, call: cst.Call) -> Optional[cst.ClassDef]:
        if not isinstance(call.func, cst.Name):
            return None
        for binding in self.index.definitions_of(call.func.value, self.script.scope_of(call)):
            if binding.kind == "class":
                return binding.node
        return None

    def _returned(self, function: cst.FunctionDef, depth: int) -> Optional[str]:
        key = id(function)
        if key in self._open:
            return None
        self._open.add(key)
        try:
            returns = [n.value for n in walk(function.body, into_definitions=False) if isinstance(n, cst.Return) and n.value is not None]
            return _alternatives([self.value(r, {}, depth + 1) for r in returns]) if returns else None
        finally:
            self._open.discard(key)

    def _length(self, of: cst.BaseExpression, env: dict, depth: int) -> Optional[str]:
        """`len(dataset)`, `len(loader.dataset)`, `len(loader)`: a constant; `len(x)` of a batch: its size."""
        if self.script.kind_of(of) in ("dataset", "loader"):
            return CONSTANT
        found = self.value(of, env, depth + 1)
        return {DATASET: CONSTANT, PER_SAMPLE: BATCH}.get(found or "")

    def _subscript(self, node: cst.Subscript, env: dict, depth: int) -> Optional[str]:
        """`x.shape[0]`, `x.size()[0]`: the batch's size."""
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index) or not _is_zero(node.slice[0].slice.value):
            return None
        of = node.value
        if (isinstance(of, cst.Attribute) and of.attr.value == "shape") or (_method(of) == "size" and not of.args):
            return BATCH
        return None

    def _factor(self, node: cst.BaseExpression, found: Optional[str]) -> Optional[str]:
        """A name the file never assigns that the training DataLoader takes as
        its batch size (`args.batch_size`) is the batch's size."""
        if found is None and isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node) in self._batch_sizes:
            return BATCH
        return found

    @property
    def _batch_sizes(self) -> set[str]:
        if self._sizes is None:
            self._sizes = set()
            for loader in self.script.loaders:
                value = loader.value
                argument = keyword_arg(value, "batch_size") if isinstance(value, cst.Call) else None
                if argument is not None and dotted_name(argument.value):
                    self._sizes.add(dotted_name(argument.value))
        return self._sizes


# -- the arithmetic of reductions ------------------------------------------------------------


def _declared(call: cst.Call, fixed_positions: int, string: Callable[[cst.BaseExpression], Optional[str]]) -> str:
    """What `reduction=` (or the old `size_average=` / `reduce=`) of a torch loss
    says; `string` reads the string a value is, where it can."""
    if has_star_args(call) or len(_positional(call)) > fixed_positions:
        return UNCLEAR
    reduction = keyword_arg(call, "reduction")
    if reduction is not None:
        return REDUCTIONS.get(string(reduction.value), UNCLEAR)
    flags = {name: literal_flag(arg.value) for name in v.LEGACY_REDUCTION for arg in [keyword_arg(call, name)] if arg is not None}
    if "?" in flags.values():
        return UNCLEAR
    if flags.get("reduce") is False:
        return PER_SAMPLE
    return SUM if flags.get("size_average") is False else MEAN


def _reduction_call(call: cst.Call, names: Iterable[str]) -> Optional[tuple[str, Optional[cst.BaseExpression]]]:
    """(MEAN or SUM, the tensor reduced) for `x.mean()`, `torch.sum(x)`; the
    tensor is None where arguments choose dimensions."""
    function = next((TORCH_REDUCTIONS[name] for name in names if name in TORCH_REDUCTIONS), None)
    if function is not None:
        positional = _positional(call)
        return function, positional[0] if len(call.args) == 1 and len(positional) == 1 else None
    method = _method(call)
    if method in ("mean", "sum"):
        return REDUCTIONS[method], call.func.value if not call.args else None
    return None


def _reduced(reduction: str, node: cst.BaseExpression, inner: Optional[str]) -> Optional[str]:
    """`.mean()` / `.sum()` of all of `node`'s elements: of a per-sample tensor
    (or arithmetic whose terms cannot be told), the reduction itself; of a loss
    already reduced, that loss (a scalar's mean or sum is itself)."""
    if inner in LOSSES or inner in (UNCLEAR, WEIGHTS):
        return inner
    if inner == PER_SAMPLE or (inner is None and isinstance(node, (cst.BinaryOperation, cst.UnaryOperation))):
        return reduction
    return None


def _arithmetic(operator: cst.BaseBinaryOp, left: Optional[str], right: Optional[str]) -> Optional[str]:
    if UNCLEAR in (left, right):
        return UNCLEAR
    if WEIGHTS in (left, right) and {left, right} <= {WEIGHTS, CONSTANT}:
        return WEIGHTS  # `theta ** 2`, `beta * penalty`
    if isinstance(operator, (cst.Add, cst.Subtract)):
        return _added(left, right)
    if isinstance(operator, cst.Multiply):
        return _scaled(left, right) or _scaled(right, left)
    if isinstance(operator, cst.Divide):
        if left == SUM and right == BATCH:
            return MEAN
        return _scaled(left, right) if right != PER_SAMPLE else None
    return PER_SAMPLE if left == PER_SAMPLE else None


def _added(left: Optional[str], right: Optional[str]) -> Optional[str]:
    if left == right:
        return left
    if PER_SAMPLE in (left, right):
        return PER_SAMPLE if not ({left, right} & {MEAN, SUM}) else None
    for loss in LOSSES:
        if loss in (left, right):
            other = right if left == loss else left
            if other in (CONSTANT, WEIGHTS) or (loss == MEAN and other is None):
                return loss  # a mean beside a term the file does not show: still averaged when divided
            return UNCLEAR
    return None


def _scaled(value: Optional[str], by: Optional[str]) -> Optional[str]:
    """`value * by` (or `value / by`) where `by` is the factor."""
    if value in LOSSES:
        if by == CONSTANT or (value == MEAN and by is None):
            return value
        if value == MEAN and by == BATCH:
            return SUM  # divided by a batch size, this would be mean / batch: not a loss reduction
        return UNCLEAR
    if value == PER_SAMPLE and by in (CONSTANT, BATCH, PER_SAMPLE, None):
        return PER_SAMPLE
    if value == CONSTANT and by == CONSTANT:
        return CONSTANT
    return None


def _alternatives(values: list) -> Optional[str]:
    """One value for several that a name may hold: a constant (`loss = 0`)
    gives way to the others; a sum beside anything else is unclear."""
    known = [found for found in values if found != CONSTANT] or values
    distinct = set(known)
    if not distinct:
        return None
    if len(distinct) == 1:
        return distinct.pop()
    return UNCLEAR if distinct & {SUM, UNCLEAR} else None


def _change_of(binding: Binding, name: str) -> Optional[cst.BaseExpression]:
    """The expression a binding that reads `name` itself assigns (`loss = loss / n`),
    or `name op value` for `name op= value`."""
    statement = binding.statement
    if binding.kind == "augassign" and isinstance(statement, cst.AugAssign):
        operator = getattr(cst, type(statement.operator).__name__.removesuffix("Assign"))()  # AddAssign -> Add
        return cst.BinaryOperation(left=statement.target, operator=operator, right=statement.value)
    if binding.kind == "assign" and binding.value is not None and _reads(binding.value, name):
        return binding.value
    return None


def _reads(node: cst.CSTNode, name: str) -> bool:
    """Does `node` read `name` (a name or `self.x`; not the `x` of `other.x`)?"""
    members = set()
    for current in walk(node, into_definitions=False):
        if isinstance(current, cst.Attribute):
            members.add(id(current.attr))
        if isinstance(current, (cst.Name, cst.Attribute)) and id(current) not in members and dotted_name(current) == name:
            return True
    return False


def _clauses(clause: Optional[cst.CompFor]) -> Iterable[cst.CompFor]:
    while clause is not None:
        yield clause
        clause = clause.inner_for_in


def _method(node: cst.CSTNode) -> Optional[str]:
    return node.func.attr.value if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) else None


def _positional(call: cst.Call) -> list[cst.BaseExpression]:
    return [a.value for a in call.args if a.keyword is None and not a.star]


def _is_zero(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer) and node.evaluated_value == 0


__all__ = ["MEAN", "SUM", "UNCLEAR", "backward_reduction", "loss_reduction", "training_reductions"]
