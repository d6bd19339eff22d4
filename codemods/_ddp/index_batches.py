"""Batches a script draws without a DataLoader: slices of a data set tensor in
a range loop (`X[i:i + B]`), whole tensors every step (full-batch training),
what a function of the file returns (`inp, target = random_batch()`). Every
rank draws the same batch (they are seeded alike), so each keeps its share of
it, `rank_share(X[i:i + B])`: the rows `rank, rank + world, ...`, those
DistributedSampler would give it, and together the original's batch.

The batches are found by meaning: from the loss that reaches `backward()`,
back through the step's assignments, the model's and the criterion's
arguments and the tensor methods on them, to what the step reads from outside
(a subscript of a tensor, a tensor, a call of the file's own function that
takes nothing from the step). Anything on that way that cannot be read (a
random draw, a tensor of a fixed size, arithmetic with a tensor from outside,
a loop target) leaves the whole step as it was, with a finding: sharding some
of a step's tensors and not the others would change what it computes.

A state the model's own method makes for the batch (`model.init_hidden(8)`,
an RNN's hidden state) gets `per_process_batch_size(8)`: each rank's state
holds the rows of its share.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst

from .._base import keyword_arg, walk
from ..script.reduction import SUM, UNCLEAR, backward_reduction
from ..script.uses import FOLLOW_DEPTH
from .common import Var, call_of
from .._shapes import SHAPE_METHODS
from .noise import RankNoise

RANDOM_DRAWS = frozenset(
    f"torch.{name}" for name in
    ("randn", "rand", "randint", "randn_like", "rand_like", "randint_like", "randperm", "normal", "bernoulli", "multinomial", "poisson")
)  # fmt: skip
ARRAY_LIBRARIES = ("torch.", "numpy.")
# Recurrent and attention layers take (time, batch, ...) unless told `batch_first=True`.
SEQUENCE_FIRST_LAYERS = frozenset(
    f"torch.nn.{name}" for name in
    ("RNN", "LSTM", "GRU", "MultiheadAttention", "Transformer", "TransformerEncoderLayer", "TransformerDecoderLayer")
)  # fmt: skip
VARIABLE = frozenset({"torch.autograd.Variable", "torch.autograd.variable.Variable"})
SEQUENCE_BUILDERS = frozenset({"builtins.tuple", "builtins.list"})
# What a name may hold that is no batch: the step passes these around.
NOT_DATA_KINDS = frozenset({"model", "optimizer", "scheduler", "loader", "scaler", "device", "criterion", "dataset"})
NOT_DATA_BINDINGS = frozenset({"import", "def", "class", "for", "except"})
LITERALS = (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)


class Untraceable(Exception):
    def __init__(self, node: cst.CSTNode, reason: str) -> None:
        super().__init__(reason)
        self.node, self.reason = node, reason


@dataclasses.dataclass
class StepBatches:
    roots: dict  # node -> None: what the step reads from outside as its batch
    states: dict  # size argument of a model's state method -> None


class IndexBatchSharding(RankNoise):
    """Plans `rank_share(...)` at the batches a training step draws by itself."""

    def _plan_index_batches(self) -> Optional[Untraceable]:
        """Plans the shares; None when done, else why not (nothing found, or a step that cannot be read)."""
        roots: dict[cst.CSTNode, bool] = {}
        states: dict[cst.CSTNode, None] = {}
        steps = self.script.training_steps
        if not steps:
            return Untraceable(self._uses.backward_calls[0], "no training step found")
        if self.per_process:
            return Untraceable(
                self._uses.backward_calls[0],
                "ddp=per-process keeps each process's batch, and a batch the step draws itself has no other samples to "
                "give the other ranks; `--to ddp` gives each rank its share of it",
            )
        for layer in self._calls_to(SEQUENCE_FIRST_LAYERS):
            flag = keyword_arg(layer, "batch_first")
            if flag is None or not (isinstance(flag.value, cst.Name) and flag.value.value == "True"):
                return Untraceable(layer, f"`{self._code(layer.func)}` without `batch_first=True`: its batch is not the first dimension of its input")
        for step in steps:
            region = self._step_region(step)
            if region is None:
                return Untraceable(step.backward, "the step runs once, in no loop")
            reduction = backward_reduction(self.script, step.backward)
            if reduction == UNCLEAR:
                return Untraceable(step.backward, "whether the loss is a mean or a sum over the batch cannot be read")
            if reduction == SUM and self.word != "ddp":
                # Only ddp adds the ranks' gradients up (`sum_gradients_across_ranks`); averaged, the
                # gradient of a summed loss over disjoint shares is 1/world of the original's.
                return Untraceable(step.backward, f"a loss summed over the batch, whose gradients {self.word} averages across the ranks")
            try:
                found = _Trace(self, region).of_step(step)
            except Untraceable as problem:
                return problem
            for root in found.roots:
                if roots.get(root, reduction == SUM) != (reduction == SUM):
                    return Untraceable(root, "a batch that feeds a mean loss and a summed one")
                roots[root] = reduction == SUM
            states.update(found.states)
        if not roots:
            return Untraceable(steps[0].backward, "the step reads no batch from outside itself")
        for name in ["rank_share", *(["per_process_batch_size"] if states else [])]:
            if any(self._clashes(n) for n in self._uses.names.get(name, ())):
                return Untraceable(self._uses.names[name][0], f"`{name}`, which the sharded step needs, already names something here")
        self._plan_rank_shares(roots, states)
        return None

    def _step_region(self, step) -> Optional[cst.CSTNode]:
        """What runs once per step: the body of the loop around the backward,
        or the function that holds it when a loop calls that function."""
        if step.loops:
            return step.loops[0].node.body
        if step.called_in_loops and isinstance(step.function.node, cst.FunctionDef):
            return step.function.node.body
        return None

    def _plan_rank_shares(self, roots: dict[cst.CSTNode, bool], states: dict[cst.CSTNode, None]) -> None:
        ordered = sorted(roots, key=lambda n: self._position(n))
        shown = ", ".join(f"`{self._code(n)}`" for n in ordered[:3]) + (", ..." if len(ordered) > 3 else "")

        def apply() -> None:
            self._use("rank_share")
            for node, summed in roots.items():
                self._edits[node] = (lambda updated: _rank_share_of(updated, True)) if summed else (lambda updated: _rank_share_of(updated, False))
            if states:
                self._use("per_process_batch_size")
            for size in states:
                self._edits[size] = lambda updated: call_of("per_process_batch_size", updated)

        uneven = (
            "a loss summed over the batch takes unequal shares as they come" if all(roots.values())
            else "a batch the processes cannot split evenly goes whole to every rank, so that the mean is the batch's"
        )
        state_note = (
            "; the state the model makes for it is sized `per_process_batch_size(...)`" if states else ""
        )
        self._step(
            ordered[0], "AM539",
            f"`rank_share(...)` at the batch this step draws without a DataLoader ({shown}): each rank trains on "
            f"its rows `rank::world` of the original's batch, together that batch ({uneven}){state_note}",
            apply, core=False,
        )


def _rank_share_of(node: cst.BaseExpression, summed: bool) -> cst.Call:
    if not summed:
        return call_of("rank_share", node)
    # `summed=True`: the shares of a summed loss are disjoint even when unequal.
    template = cst.parse_expression("rank_share(batch, summed=True)")
    return template.with_changes(args=[template.args[0].with_changes(value=node), template.args[1]])


class _Trace:
    """What one step's loss is computed from, followed back to what the step
    reads from outside itself (`region`: the code that runs once per step)."""

    def __init__(self, codemod: IndexBatchSharding, region: cst.CSTNode) -> None:
        self.codemod = codemod
        self.script = codemod.script
        self.region = region
        self.found = StepBatches({}, {})
        self._memo: dict[cst.CSTNode, bool] = {}
        self._array_memo: dict[cst.CSTNode, bool] = {}

    def of_step(self, step) -> StepBatches:
        backward = step.backward
        if not isinstance(backward.func, cst.Attribute):
            raise Untraceable(backward, "a backward of a form the tracing does not read")
        if not self.expression(backward.func.value, direct=True):
            raise Untraceable(backward, "the loss is computed from nothing the step reads from outside")
        return self.found

    # -- where things are -----------------------------------------------------------

    def inside(self, node: cst.CSTNode) -> bool:
        return any(a is self.region for a in self.codemod.ancestors(node))

    def bound_inside(self, node: cst.BaseExpression) -> bool:
        """`node` reads, at its base, a name the step binds (`batch[0]`, `x.cuda()`)."""
        while isinstance(node, (cst.Attribute, cst.Subscript, cst.Call)):
            node = node.func if isinstance(node, cst.Call) else node.value
        return isinstance(node, cst.Name) and any(self.inside(b.node) for b in self.script.bindings_of(node.value, node))

    # -- the reading ----------------------------------------------------------------

    def expression(self, node: cst.BaseExpression, direct: bool) -> bool:
        """Does `node` carry the step's batch? Records where it comes from.
        `direct`: handed on as it is (an argument), not an operand of arithmetic."""
        if isinstance(node, LITERALS):
            return False
        if isinstance(node, cst.Name):
            return self.name(node, direct)
        if isinstance(node, cst.Attribute):
            if self.bound_inside(node.value):
                return self.expression(node.value, direct)
            if direct and self.script.kind_of(node) not in NOT_DATA_KINDS:
                raise Untraceable(node, f"`{self.codemod._code(node)}` is read in the step, and what it holds cannot be seen")
            return False
        if isinstance(node, cst.Subscript):
            if self.bound_inside(node.value) or not isinstance(node.value, (cst.Name, cst.Attribute)):
                return self.expression(node.value, direct)
            if not (isinstance(node.value, cst.Name) and self.holds_array(node.value)):
                raise Untraceable(node, f"`{self.codemod._code(node.value)}` is indexed in the step, and it cannot be seen to hold a tensor")
            self.found.roots[node] = None  # `X[i:i + B]`: drawn from a tensor by index
            return True
        if isinstance(node, cst.Call):
            return self.call(node, direct)
        if isinstance(node, cst.BinaryOperation):
            left = self.expression(node.left, direct=False)
            return self.expression(node.right, direct=False) or left
        if isinstance(node, cst.UnaryOperation):
            return self.expression(node.expression, direct=False)
        if isinstance(node, (cst.Tuple, cst.List)):
            return any([self.expression(e.value, direct) for e in node.elements])
        if isinstance(node, cst.IfExp):
            body = self.expression(node.body, direct)
            return self.expression(node.orelse, direct) or body
        if isinstance(node, (cst.GeneratorExp, cst.ListComp)) and node.for_in.inner_for_in is None:
            return self.expression(node.for_in.iter, direct)
        raise Untraceable(node, f"`{self.codemod._code(node)}` is of a form the tracing does not read")

    def name(self, node: cst.Name, direct: bool) -> bool:
        if node.value in ("True", "False", "None"):
            return False
        bindings = self.script.bindings_of(node.value, node)
        inside = [b for b in bindings if self.inside(b.node)]
        outside = [b for b in bindings if not self.inside(b.node)]
        if inside:
            carries = False
            for binding in inside:
                carries = self.binding(binding) or carries
            for binding in outside:  # a state carried from step to step (an RNN's hidden state)
                value = _bound_value(binding)
                if value is not None:
                    self.model_state(value)
            return carries
        return self.from_outside(node, outside, direct)

    def from_outside(self, node: cst.Name, bindings: list, direct: bool) -> bool:
        if direct and any(b.kind == "for" for b in bindings):
            raise Untraceable(node, f"`{node.value}` is an item of a loop over what the tracing does not read as a batch")
        if not bindings or all(b.kind in NOT_DATA_BINDINGS for b in bindings):
            return False
        if self.script.kind_of(node) in NOT_DATA_KINDS:
            return False
        values = [_bound_value(b) for b in bindings if b.kind not in NOT_DATA_BINDINGS]
        if any(value is not None and self.model_state(value) for value in values):
            return False
        if all(value is not None and _is_constant(value) for value in values):
            return False
        if not direct:
            raise Untraceable(node, f"`{node.value}` from outside the step is an operand of arithmetic in it: a tensor or not, "
                                    "and sized by the batch or not, cannot be seen")
        if not self.holds_array(node):
            raise Untraceable(node, f"`{node.value}` is read in the step, and it cannot be seen to hold a tensor")
        self.found.roots[node] = None  # a whole tensor every step
        return True

    # -- what holds a tensor ------------------------------------------------------------

    def holds_array(self, name: cst.Name, depth: int = 0) -> bool:
        """Every binding of `name` there gives it a tensor (or a NumPy array):
        made by torch or NumPy, or computed from one (`X.to(device)`,
        `X[:, 0] > 0`); a parameter, as its one caller passes it."""
        if depth > FOLLOW_DEPTH:
            return False
        bindings = self.script.bindings_of(name.value, name)
        return bool(bindings) and all(self.binding_holds_array(b, depth) for b in bindings)

    def binding_holds_array(self, binding, depth: int) -> bool:
        if binding.node in self._array_memo:
            return self._array_memo[binding.node]
        self._array_memo[binding.node] = True  # `X = X.to(device)`: decided by the other bindings
        if binding.kind == "param":
            caller = self.codemod._caller_binding(Var(binding.name, binding.scope))
            passed = self.codemod._bindings_of_var(caller[0]) if caller is not None else []
            found = bool(passed) and all(self.binding_holds_array(b, depth + 1) for b in passed)
        elif binding.kind in ("assign", "augassign"):
            value = binding.statement.value if binding.kind == "augassign" else _bound_value(binding)
            found = value is not None and self.array_like(value, depth)
        else:
            found = False
        self._array_memo[binding.node] = found
        return found

    def array_like(self, node: cst.BaseExpression, depth: int) -> bool:
        if isinstance(node, cst.Call):
            names = self.script.qualified_names(node.func)
            if any(n.startswith(ARRAY_LIBRARIES) for n in names):
                return self.script.kind_of(node) not in NOT_DATA_KINDS
            if isinstance(node.func, cst.Attribute) and not self.imported(node.func):
                return self.array_like(node.func.value, depth)  # `X.to(device)`, `X.float()`
            return False
        if isinstance(node, cst.Subscript):
            return self.array_like(node.value, depth)
        if isinstance(node, cst.BinaryOperation):
            return self.array_like(node.left, depth) or self.array_like(node.right, depth)
        if isinstance(node, (cst.UnaryOperation, cst.Comparison)):
            return self.array_like(node.expression if isinstance(node, cst.UnaryOperation) else node.left, depth)
        if isinstance(node, cst.IfExp):
            return self.array_like(node.body, depth) and self.array_like(node.orelse, depth)
        if isinstance(node, cst.Name):
            return self.holds_array(node, depth + 1)
        return False

    def binding(self, binding) -> bool:
        key = binding.node
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = False  # against cycles: `data = data.cuda()`
        if binding.kind == "augassign":
            value = binding.statement.value
        elif binding.kind in ("assign", "with", "named"):
            value = _bound_value(binding)
        else:
            raise Untraceable(binding.node, f"`{binding.name}` is bound by a {binding.kind} in the step")
        if value is None:
            raise Untraceable(binding.node, f"`{binding.name}` is unpacked from what the tracing does not read")
        self._memo[key] = self.expression(value, direct=True)
        return self._memo[key]

    def call(self, call: cst.Call, direct: bool) -> bool:
        names = self.script.qualified_names(call.func)
        if names & RANDOM_DRAWS:
            raise Untraceable(call, f"a random draw in the step (`{self.codemod._code(call)}`): alike on every rank")
        if any(a.star for a in call.args):
            raise Untraceable(call, "a call with `*args` in the step")
        positional = [a.value for a in call.args if a.keyword is None]
        if names & (VARIABLE | SEQUENCE_BUILDERS) and positional:
            return self.expression(positional[0], direct)
        if any(n.startswith("builtins.") for n in names):
            return False
        if isinstance(call.func, cst.Attribute) and not self.imported(call.func) and self.script.kind_of(call.func) != "model":
            return self.method(call, positional)
        function = self.batch_function(call)
        if function is not None:
            if not any([self.expression(value, direct=True) for value in positional]):
                if not self.returns_arrays(function):
                    raise Untraceable(call, f"`{self.codemod._code(call)}` cannot be seen to return the batch's tensors")
                self.found.roots[call] = None  # the batch a function of the file draws
            return True
        carries = any([self.expression(value, direct=True) for value in positional])
        for argument in call.args:
            # A keyword computed in the step (`logits=actor(obs)`) is read; a
            # setting from outside (`weight=class_weights`) is no batch.
            value = argument.value
            if argument.keyword is not None and (self.bound_inside(value) or not isinstance(value, (cst.Name, cst.Attribute))):
                carries = self.expression(value, direct=True) or carries
        if not carries:
            raise Untraceable(call, f"`{self.codemod._code(call)}` is computed in the step from nothing it reads as the batch")
        return True

    def method(self, call: cst.Call, positional: list) -> bool:
        """`x.to(device)`, `h.detach()`, `out.reshape(-1, n)`: the receiver's batch."""
        receiver = call.func.value
        if self.model_state(call):
            return False
        if self.script.kind_of(receiver) == "model":
            return any([self.expression(value, direct=True) for value in positional])
        if call.func.attr.value in SHAPE_METHODS and positional and not self.sized_freely(positional[0]):
            raise Untraceable(call, f"`{self.codemod._code(call)}` shapes the batch with a size it does not take from it")
        carries = self.expression(receiver, direct=True)
        for value in positional:
            if self.bound_inside(value):
                carries = self.expression(value, direct=True) or carries
        return carries

    def sized_freely(self, size: cst.BaseExpression) -> bool:
        """A first size that is not the batch's: `-1`, or read from the batch itself (`x.size(0)`)."""
        if isinstance(size, cst.UnaryOperation) and isinstance(size.expression, cst.Integer):
            return True
        return self.bound_inside(size)

    def model_state(self, value: cst.BaseExpression) -> bool:
        """`model.init_hidden(8)`: a model's own method given a size, not a
        batch; records the size for `per_process_batch_size`."""
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)):
            return False
        if self.script.kind_of(value.func.value) != "model" or self.script.kind_of(value.func) == "model":
            return False
        positional = [a.value for a in value.args if a.keyword is None and not a.star]
        if len(positional) != 1 or not isinstance(positional[0], (cst.Integer, cst.Name, cst.Attribute)):
            return False
        if self.bound_inside(positional[0]):
            return False
        self.found.states[positional[0]] = None
        return True

    def imported(self, func: cst.Attribute) -> bool:
        """`F.relu`, `torch.nn.functional.mse_loss`: a module's function, not a method."""
        base = func
        while isinstance(base, cst.Attribute):
            base = base.value
        return isinstance(base, cst.Name) and any(b.kind == "import" for b in self.script.bindings_of(base.value, base))

    def batch_function(self, call: cst.Call) -> Optional[cst.FunctionDef]:
        """The function (not a class) of the file that `call` runs."""
        if not isinstance(call.func, cst.Name):
            return None
        bindings = self.script.bindings_of(call.func.value, call)
        if len(bindings) != 1 or bindings[0].kind != "def":
            return None
        return bindings[0].node

    def returns_arrays(self, function: cst.FunctionDef) -> bool:
        """Every `return` of the function gives tensors (`return x, y`)."""
        own = self.script.index.scope_by_node.get(function)
        returns = [n for n in walk(function.body) if isinstance(n, cst.Return) and self.script.scope_of(n) is own]
        if not returns or any(r.value is None for r in returns):
            return False
        values = []
        for returned in returns:
            parts = returned.value.elements if isinstance(returned.value, (cst.Tuple, cst.List)) else ()
            values.extend([part.value for part in parts] or [returned.value])
        return all(self.array_like(value, 0) for value in values)


def _bound_value(binding) -> Optional[cst.BaseExpression]:
    """What a binding gives its name: the value, or the matching element of
    `a, b = x, y`; None where it cannot be seen."""
    if binding.value is not None:
        return binding.value
    statement = binding.statement
    if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
        target, value = statement.targets[0].target, statement.value
        if isinstance(target, (cst.Tuple, cst.List)):
            for position, element in enumerate(target.elements):
                if element.value is binding.node:
                    if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(target.elements):
                        return value.elements[position].value
                    return value  # `inp, target = random_batch()`: the whole of what is unpacked
    return None


def _is_constant(value: cst.BaseExpression) -> bool:
    """A number or a setting (`args.lr`, `float(x)`): never a batch."""
    if isinstance(value, LITERALS):
        return True
    if isinstance(value, cst.UnaryOperation):
        return _is_constant(value.expression)
    if isinstance(value, cst.BinaryOperation):
        return _is_constant(value.left) and _is_constant(value.right)
    return isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) and value.value.value == "args"
