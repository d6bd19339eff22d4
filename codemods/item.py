"""item: stop keeping losses, with their autograd graphs, across iterations.

What it does
    Finds a loss: a tensor that `.backward()` is called on (also through
    `scaler.scale(loss)`, `(loss / n)`, `torch.autograd.backward(...)`,
    `self.manual_backward(loss)`), the tensors it is computed from by arithmetic
    (`loss_sum = loss1 + loss2`) and the values computed from it
    (`total_loss = loss * w`). Where a loop stores one in something that
    outlives the iteration (`losses.append(loss)`, `total += loss`,
    `running = running + loss`, `history[k] = loss`, `self.losses.append(loss)`,
    a global), it stores `loss.item()` when every later use of that
    accumulator reads it as a number (printing, formatting, arithmetic,
    comparisons, `float()`, `sum()`, `np.mean()`, logging), and
    `loss.detach()` when later code treats it as a tensor (`torch.stack`,
    `.mean()`, `.cpu()`, `.numpy()`, `.item()`) or the loss may hold more than
    one number. Later uses are followed through assignments, loops,
    comprehensions, containers, the callers of a function that returns the
    accumulator, and the methods of the class for `self.` attributes.

Why
    A loss references the whole graph of the forward pass that produced it.
    Adding it to a list or a running total keeps every graph alive for as
    long as the accumulator lives (with `retain_graph=True`, or before
    `backward()`, with all their saved activations), and a running total
    grows one long graph: memory climbs every step until the epoch ends or the
    device runs out. `.item()` keeps a Python float and lets the graph go;
    `.detach()` keeps the same tensor without its history.

Example
    Before::

        losses = []
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss)
        print(sum(losses) / len(losses))

    After::

        losses = []
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        print(sum(losses) / len(losses))

Left alone
    Values already detached (`loss.item()`, `loss.detach()`, `loss.data`,
    `loss.data[0]`, `float(loss)`); accumulators assigned afresh in every
    iteration of the loop that computes the loss; values kept in order to be
    backpropagated later (per-step policy-gradient losses stacked and summed
    before `.backward()`, `total += loss` followed by `total.backward()`);
    tensors that are not losses (an RNN's hidden state, predictions) and plain
    numbers that losses are multiplied by. When the later use cannot be
    followed (the accumulator is an argument, an attribute of another object,
    passed to an unknown function, returned to no caller in the file, a
    `self.` attribute never read in the file, or a meter's `update(loss, n)`)
    it reports AM203 and changes nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Union

import libcst as cst
from libcst.metadata import GlobalScope, PositionProvider, QualifiedNameProvider, QualifiedNameSource, ScopeProvider

from ._base import Codemod, code_of, walk

# -- what the syntax says, without metadata -----------------------------------

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


class Item(Codemod):
    word = "item"
    summary = "store loss.item() / loss.detach(), not the loss and its graph, across iterations"
    codes = {
        "AM201": "a loss kept across iterations with its graph, later read as a number: stored with .item()",
        "AM202": "a loss kept across iterations with its graph, later used as a tensor: stored with .detach()",
        "AM203": "a loss kept across iterations with its graph, whose later use cannot be followed: detach it by hand",
    }
    triggers = ("backward",)
    METADATA_DEPENDENCIES = (*Codemod.METADATA_DEPENDENCIES, ScopeProvider)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._rewrites: dict[cst.CSTNode, str] = {}  # loss expression -> "item" / "detach"
        self._nodes = _Nodes()

    # -- the rewrite ---------------------------------------------------------------

    # The nodes the analysis needs are gathered during this codemod's own pass;
    # the analysis runs when the pass ends, and a second pass rewrites, only
    # when there is something to rewrite.

    def visit_Call(self, node: cst.Call) -> None:
        self._nodes.calls.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._nodes.attributes.append(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._nodes.bindings.append((target.target, node.value, node))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._nodes.bindings.append((node.target, node.value, node))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._nodes.bindings.append((node.target, node.value, node))

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._nodes.bindings.append((node.asname.name, node.item, node))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        analysis = _Analysis(self, self._nodes)
        for accumulator, stores in analysis.accumulators().items():
            self._settle(analysis, accumulator, stores)
        if not self._rewrites:
            return updated_node
        # Nothing else changed in this pass: rewrite the original, whose nodes the rewrites name.
        return original_node.visit(_Rewriter(self._rewrites))

    def _settle(self, analysis: "_Analysis", accumulator: tuple, stores: list[Store]) -> None:
        verdict = analysis.later_uses(accumulator, stores)
        if verdict.need is Need.GRAPH:
            return  # collected to be backpropagated: the graph is the point
        all_scalar = all(scalar for store in stores for _, scalar in store.atoms)
        method = "item" if verdict.need <= Need.NUMBER and all_scalar else "detach"
        for store in stores:
            if store.is_update:
                self._report_update(store)
            elif store.opaque or verdict.need is Need.UNKNOWN:
                why = (
                    verdict.why
                    if verdict.need is Need.UNKNOWN
                    else "the loss reaches it through an expression not rewritten"
                )
                self._report_unknown(store, why)
            else:
                self._rewrite(store, method, verdict)

    def _rewrite(self, store: Store, method: str, verdict: Verdict) -> None:
        loss, where = _describe(store)
        kept = f"{loss} is kept in {where} across iterations with its whole autograd graph"
        if method == "item":
            code, message = "AM201", f"{kept}, and {where} is only read as a number: store {loss}.item()"
        elif verdict.need is Need.TENSOR:
            code, message = "AM202", f"{kept}, and {where} is later used as a tensor: store {loss}.detach()"
        else:
            code, message = "AM202", f"{kept}, and {loss} may hold more than one number: store {loss}.detach()"
        if self.fix(store.node, code, message):
            for atom, _ in store.atoms:
                self._rewrites[atom] = method

    def _report_update(self, store: Store) -> None:
        loss, _ = _describe(store)
        meter = code_of(store.node.func.value)
        self.report(
            store.node,
            "AM203",
            f"{meter}.update() gets {loss} with its autograd graph, and what {meter} keeps cannot be seen: "
            f"pass {loss}.item() (or {loss}.detach()) if it keeps the value across iterations",
        )

    def _report_unknown(self, store: Store, why: str) -> None:
        loss, where = _describe(store)
        self.report(
            store.node,
            "AM203",
            f"{loss} is kept in {where} across iterations with its autograd graph, and what later code does with it "
            f"cannot be followed ({why}): store {loss}.item() if it is only read as a number, else {loss}.detach(), "
            "unless it is backpropagated later",
        )


class _Rewriter(cst.CSTTransformer):
    """Appends `.item()` or `.detach()` to the chosen loss expressions."""

    def __init__(self, rewrites: dict[cst.CSTNode, str]) -> None:
        super().__init__()
        self.rewrites = rewrites

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> Expression:
        return self._rewritten(original_node, updated_node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> Expression:
        return self._rewritten(original_node, updated_node)

    def _rewritten(self, original: Expression, updated: Expression) -> Expression:
        method = self.rewrites.get(original)
        if method is None:
            return updated
        return cst.Call(func=cst.Attribute(value=updated, attr=cst.Name(method)))


def _describe(store: Store) -> tuple[str, str]:
    """How messages name the stored loss and the accumulator."""
    stored = store.atoms[0][0] if store.atoms else store.values[0]
    loss = code_of(stored)
    if not isinstance(stored, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        loss = f"({loss})"
    return loss, code_of(_holder_of(store.target))


def _holder_of(target: Expression) -> Expression:
    """`history` for `history[k]` and `history[k][j]`."""
    while isinstance(target, cst.Subscript):
        target = target.value
    return target


# -- the analysis ---------------------------------------------------------------------

# An accumulator: ("name", scope, name) for a variable, ("attr", name) for an attribute.
AccumulatorKey = tuple


class _Analysis:
    """Which names hold losses, where they are stored across iterations, and
    what the code does later with what was stored. Works on one module, with
    the codemod's metadata."""

    def __init__(self, codemod: Item, nodes: "_Nodes") -> None:
        self.codemod = codemod
        self.nodes = nodes
        self.losses: dict[tuple, bool] = {}  # (scope, name) -> known to be 0-d
        self.containers: set[tuple] = set()  # lists whose elements are stacked and backpropagated
        self._definitions: dict[int, list[cst.CSTNode]] = {}  # id(Name) -> what reaches it
        self._loss_definitions: set[int] = set()  # ids of binding targets that give a loss
        self._pending: list[tuple[cst.Name, bool]] = []  # loss reads whose sources are still to find
        self._traced: set[int] = set()
        self._doubtful: list[tuple[cst.Name, bool]] = []  # operands not (yet) known to be tensors
        self._following: set = set()  # what is being followed now, against cycles
        self._find_losses()

    # -- metadata helpers ---------------------------------------------------------

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.codemod.parent(node)

    def scope(self, node: cst.CSTNode):
        return self.codemod.get_metadata(ScopeProvider, node, None)

    def method(self, call: cst.Call) -> Optional[str]:
        """`x.name(...)` called on a value, not a function of an imported module."""
        if not isinstance(call.func, cst.Attribute):
            return None
        receiver = call.func.value
        if isinstance(receiver, (cst.Name, cst.Attribute)):
            names = self.codemod.get_metadata(QualifiedNameProvider, receiver, set())
            if any(q.source in (QualifiedNameSource.IMPORT, QualifiedNameSource.BUILTIN) for q in names):
                return None  # `torch.stack(...)`, `F.mse_loss(...)`: a module's function
        return call.func.attr.value

    def key(self, name: cst.Name) -> Optional[tuple]:
        """The variable `name` refers to: (defining scope, name)."""
        scope = self.scope(name)
        if scope is None:
            return None
        homes = {assignment.scope for assignment in scope[name.value]}
        return (homes.pop() if len(homes) == 1 else scope, name.value)

    def assignments(self, key: tuple) -> list:
        scope, name = key
        return [a for a in scope[name] if a.scope is scope] if name in scope else []

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The small statement (or compound statement) that contains `node`."""
        current = node
        while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            current = self.parent(current)
        return current

    def is_inside(self, node: cst.CSTNode, containers: Iterable[cst.CSTNode]) -> bool:
        containers = set(map(id, containers))
        return any(id(a) in containers for a in (node, *self.codemod.ancestors(node)))

    # -- 1. losses --------------------------------------------------------------------

    def _find_losses(self) -> None:
        """Names `.backward()` is called on, the names their values are
        computed from, and the names computed from those, until nothing changes."""
        for call in self.nodes.calls:
            self._backward_roots(call)
        while True:
            before = (dict(self.losses), set(self.containers))
            while self._pending:
                name, scalar = self._pending.pop()
                for value in self._reaching_values(name):
                    self._add_roots(value, scalar)
            for target, value, statement in self.nodes.bindings:
                self._derive(target, value, statement)
            for call in self.nodes.calls:
                if self.method(call) == "append" and call.args and self._is_container(call.func.value):
                    for root in self._roots(call.args[0].value, False, OPERAND_ROOT):
                        self._add_root(*root)
            doubtful, self._doubtful = self._doubtful, []
            for name, scalar in doubtful:  # a loss found since may now show them to be tensors
                self._add_root(name, scalar, OPERAND_ROOT)
            if (self.losses, self.containers) == before and not self._pending:
                return

    def _backward_roots(self, call: cst.Call) -> None:
        method = self.method(call)
        positional = positional_args(call)
        if method == "backward":
            # `loss.backward()`; a gradient argument means a loss that is not 0-d;
            # `accelerator.backward(loss)` passes the loss itself.
            self._add_roots(call.func.value, not positional and _keyword(call, "gradient") is None)
            if positional:
                self._add_roots(positional[0].value, False)
        elif method == "manual_backward" and positional:
            self._add_roots(positional[0].value, True)
        elif self.codemod.is_call_to(call, {"torch.autograd.backward"}):
            tensors = positional[0] if positional else _keyword(call, "tensors")
            if tensors is not None:
                scalar = len(positional) < 2 and _keyword(call, "grad_tensors") is None
                elements = tensors.value.elements if isinstance(tensors.value, (cst.List, cst.Tuple)) else [tensors]
                for element in elements:
                    self._add_roots(element.value, scalar)

    def _derive(self, target: cst.CSTNode, value: Expression, statement: cst.CSTNode) -> None:
        """A value computed from a loss by arithmetic is a loss (`total_loss = loss * w`)."""
        if (
            not isinstance(target, cst.Name)
            or isinstance(statement, cst.AugAssign)
            or id(target) in self._loss_definitions
        ):
            return
        key = self.key(target)
        if key is None or any(self.key(n) == key for n in _names(value)):
            return  # `running = running + loss` accumulates: that is a store
        atoms, _ = self.loss_atoms(value)
        if atoms:
            self._loss_definitions.add(id(target))
            self._add_loss(
                key, all(scalar for _, scalar in atoms) and _only_atoms_and_numbers(value, {a for a, _ in atoms})
            )

    def _add_roots(self, expression: Expression, scalar: bool) -> None:
        for root in self._roots(expression, scalar, TENSOR_ROOT):
            self._add_root(*root)

    def _add_root(self, name: cst.Name, scalar: bool, kind: str) -> None:
        key = self.key(name)
        if key is None:
            return
        if kind == LIST_ROOT:
            self.containers.add(key)
            return
        if kind == OPERAND_ROOT and not self._holds_a_tensor(name):
            self._doubtful.append((name, scalar))  # `loss * weight`: weight may be a number
            return
        self._add_loss(key, scalar)
        if id(name) not in self._traced:  # what a loss is computed from is a loss
            self._traced.add(id(name))
            self._pending.append((name, scalar))

    def _holds_a_tensor(self, name: cst.Name) -> bool:
        """Does an assignment that reaches `name` give it a tensor, as far as
        the code shows (a call that is not `len()`, `.item()`, `float()`...,
        or arithmetic with a loss)?"""
        return any(self._is_tensor_value(value) for value in self._values_reaching(name))

    def _is_tensor_value(self, value: Expression) -> bool:
        if isinstance(value, cst.Name):
            return self.key(value) in self.losses
        if isinstance(value, cst.Call):
            if is_detaching(value) or self.method(value) in NUMBER_METHODS:
                return False
            names = self.codemod.qualified_names(value.func)
            return not (names & NUMBER_FUNCTIONS or any(q.startswith(NUMBER_MODULES) for q in names))
        parts = _arithmetic_parts(value)
        return parts is not None and any(self._is_tensor_value(part) for part in parts)

    def _values_reaching(self, name: cst.Name) -> Iterator[Expression]:
        for target in self.definitions(name):
            holder = self.parent(target)
            value = holder.value if isinstance(holder, cst.AugAssign) else self.bound_value(target)[0]
            if value is not None:
                yield value

    def _reaching_values(self, name: cst.Name) -> Iterator[Expression]:
        """The values that can reach this read of a loss; their assignments
        give losses."""
        for target in self.definitions(name):
            self._loss_definitions.add(id(target))
        yield from self._values_reaching(name)

    def _assigns_plainly(self, statement: cst.CSTNode, targets: set[int]) -> bool:
        if isinstance(statement, cst.WithItem):
            return True
        if isinstance(statement, cst.SimpleStatementLine):
            smalls = statement.body
        elif isinstance(statement, cst.With):
            smalls = list(_always_run(statement.body))
        else:
            smalls = [statement]
        for small in smalls:
            if isinstance(small, (cst.Assign, cst.AnnAssign)):
                bound = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                if any(id(n) in targets for target in bound for n in walk(target)):
                    return True
        return False

    def _add_loss(self, key: tuple, scalar: bool) -> None:
        self.losses[key] = self.losses.get(key, False) or scalar

    def _is_container(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Name) and self.key(node) in self.containers

    def _roots(self, expression: Expression, scalar: bool, kind: str) -> Iterator[tuple[cst.Name, bool, str]]:
        """The names whose graph a backpropagated expression goes through:
        (name, known to hold one number, TENSOR_ROOT / OPERAND_ROOT / LIST_ROOT)."""
        if isinstance(expression, cst.Name):
            yield expression, scalar, kind
        elif isinstance(expression, cst.BinaryOperation) and not isinstance(expression.operator, cst.MatrixMultiply):
            # elementwise: a one-number result needs one-number operands
            yield from self._roots(expression.left, scalar, OPERAND_ROOT)
            yield from self._roots(expression.right, scalar, OPERAND_ROOT)
        elif isinstance(expression, cst.UnaryOperation):
            yield from self._roots(expression.expression, scalar, kind)
        elif isinstance(expression, cst.Call):
            yield from self._call_roots(expression, scalar)

    def _call_roots(self, call: cst.Call, scalar: bool) -> Iterator[tuple[cst.Name, bool, str]]:
        method = self.method(call)
        positional = positional_args(call)
        if method in SCALING_METHODS and positional:
            yield from self._roots(positional[0].value, scalar, TENSOR_ROOT)
        elif method in REDUCTIONS and not call.args:
            yield from self._roots(call.func.value, False, TENSOR_ROOT)
        elif method in SAME_VALUE_METHODS:
            yield from self._roots(call.func.value, scalar, TENSOR_ROOT)
        elif positional and self.codemod.is_call_to(call, STACKING_CALLS):
            collection = positional[0].value
            if isinstance(collection, cst.Name):
                yield collection, False, LIST_ROOT
            elif isinstance(collection, (cst.List, cst.Tuple)):
                element_scalar = scalar and self.codemod.is_call_to(call, {"builtins.sum"})
                for element in collection.elements:
                    yield from self._roots(element.value, element_scalar, OPERAND_ROOT)
        elif positional and self.codemod.is_call_to(call, TENSOR_REDUCING_CALLS):
            yield from self._roots(positional[0].value, False, TENSOR_ROOT)

    # -- 2. loss expressions in a stored value -----------------------------------------

    def loss_atoms(
        self, value: Expression, exclude: frozenset = frozenset()
    ) -> tuple[list[tuple[Expression, bool]], bool]:
        """The loss expressions a stored value is made of, each with whether it is
        known to be 0-d, and whether a loss also reaches the value some other way.
        `exclude`: ids of nodes that are not to count (the accumulator itself)."""
        atoms: list[tuple[Expression, bool]] = []
        opaque = self._scan(value, atoms, exclude)
        return atoms, opaque

    def _scan(self, value: Expression, atoms: list, exclude: frozenset) -> bool:
        if is_detaching(value) or id(value) in exclude:
            return False
        atom = self._atom(value, exclude)
        if atom is not None:
            if atom == "ambiguous":
                return True
            atoms.append((value, atom))
            return False
        parts = _arithmetic_parts(value)
        if parts is not None:
            return any([self._scan(part, atoms, exclude) for part in parts])
        return self._reaches_loss(value, exclude)

    def _atom(self, value: Expression, exclude: frozenset = frozenset()) -> Union[bool, str, None]:
        """For a loss expression that `.item()`/`.detach()` can be appended to:
        whether it is known to be 0-d, or "ambiguous"; None when not a loss."""
        if id(value) in exclude:
            return None
        if isinstance(value, cst.Name):
            key = self.key(value)
            if key not in self.losses:
                return None
            state = self._state_at(value, key)
            if state == "loss":
                return self.losses[key]
            return None if state == "not a loss" else "ambiguous"
        if isinstance(value, cst.Call) and self.method(value) is not None:
            inner = self._atom(value.func.value, exclude)
            if inner is None or inner == "ambiguous":
                return inner
            if value.func.attr.value in REDUCTIONS and not value.args:
                return True
            if value.func.attr.value in SAME_VALUE_METHODS:
                return inner
        return None

    def _reaches_loss(self, value: Expression, exclude: frozenset) -> bool:
        """A loss inside a value through subscripts, tensor methods or torch
        functions (user functions and builtins are trusted to return numbers)."""
        if is_detaching(value) or id(value) in exclude:
            return False
        if isinstance(value, cst.Name):
            return self._atom(value) is not None
        if isinstance(value, (cst.Subscript, cst.Attribute)):
            return self._reaches_loss(value.value, exclude)
        parts = [value.left, value.right] if isinstance(value, cst.BinaryOperation) else _arithmetic_parts(value)
        if parts is not None:
            return any(self._reaches_loss(part, exclude) for part in parts)
        if isinstance(value, cst.Call):
            if self.method(value) is not None:
                return self._reaches_loss(value.func.value, exclude)
            if any(q.startswith("torch.") for q in self.codemod.qualified_names(value.func)):
                return any(self._reaches_loss(arg.value, exclude) for arg in value.args)
        return False

    def _state_at(self, name: cst.Name, key: tuple) -> str:
        """What a variable that holds a loss somewhere holds where `name` reads
        it: "loss", "not a loss" or "ambiguous". A loss if an assignment that
        reaches the read gave it a loss; ambiguous if another gave it a detached
        value (`loss = loss.item()` in a branch)."""
        definitions = self.definitions(name)
        if not definitions:  # an argument, a global: only the name tells
            kinds = {self._assignment_kind(a.node) for a in self.assignments(key)}
            return "ambiguous" if "detached" in kinds else "loss"
        kinds = {"loss" if id(d) in self._loss_definitions else self._assignment_kind(d) for d in definitions}
        if "loss" not in kinds:
            return "not a loss"
        return "ambiguous" if "detached" in kinds else "loss"

    def definitions(self, name: cst.Name) -> list[cst.CSTNode]:
        """The binding targets whose values can reach this read of `name`:
        walking back from it, every assignment met, up to the first one that
        always runs (those behind a condition or in a loop may not), or the
        `for`/`with` header that binds it."""
        if id(name) in self._definitions:
            return self._definitions[id(name)]
        key = self.key(name)
        targets = {id(a.node) for a in self.assignments(key)} if key is not None else set()
        found: list[cst.CSTNode] = []
        if targets:
            for statement in self._statements_before(name, binder=name.value):
                assigned = [n for n in walk(statement) if id(n) in targets]
                found.extend(assigned)
                if assigned and self._assigns_plainly(statement, targets):
                    break
        self._definitions[id(name)] = found
        return found

    def _assignment_kind(self, node: cst.CSTNode) -> str:
        """What an assignment gives: "detached", "init" (a number or None) or "graph"."""
        value, _ = self.bound_value(node)
        if value is None:
            return "graph"
        if is_number_literal(value):
            return "init"
        if is_detaching(value) or self.codemod.is_call_to(value, {"builtins.float", "builtins.int"}):
            return "detached"
        return "graph"

    def _statements_before(self, node: cst.CSTNode, binder: Optional[str] = None) -> Iterator[cst.CSTNode]:
        """The statements that run before `node`, nearest first, within its
        function. With `binder`, stops at a `for` or `with` header that binds
        that name (yielding the `with` item, whose value it gets)."""
        current = self.statement_of(node)
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            holder = self.parent(current)
            siblings = getattr(holder, "body", None)
            if isinstance(siblings, (list, tuple)):
                index = next((i for i, s in enumerate(siblings) if s is current), 0)
                yield from reversed(siblings[:index])
            elif (
                binder is not None
                and isinstance(holder, cst.For)
                and binder in {n.value for n in _names(holder.target)}
            ):
                yield holder.target
                return
            elif binder is not None and isinstance(holder, cst.With):
                items = [
                    item for item in holder.items if item.asname and binder in {n.value for n in _names(item.asname)}
                ]
                if items:
                    yield items[-1]
                    return
            current = holder

    # -- 3. stores across iterations --------------------------------------------------

    def accumulators(self) -> dict[AccumulatorKey, list[Store]]:
        found: dict[AccumulatorKey, list[Store]] = {}
        if not self.losses:
            return found
        for store in self._stores():
            accumulator = self.accumulator_of(store.target)
            if (
                accumulator is not None
                and (store.atoms or store.opaque)
                and self._kept_across_iterations(store, accumulator)
            ):
                found.setdefault(accumulator, []).append(store)
        return found

    def _stores(self) -> Iterator[Store]:
        for call in self.nodes.calls:
            method = self.method(call)
            if method in STORING_METHODS or method == "update":
                if isinstance(self.parent(call), cst.Expr):
                    values = [arg.value for arg in call.args]
                    if method == "insert":
                        values = values[1:]
                    yield self._store(call, call.func.value, values, is_update=method == "update")
        for target, value, statement in self.nodes.bindings:
            if isinstance(statement, cst.AugAssign):
                yield self._store(statement, target, [value])
            elif isinstance(statement, cst.Assign) and isinstance(target, cst.Subscript):
                yield self._store(statement, target, [value])
            elif isinstance(statement, cst.Assign) and isinstance(target, (cst.Name, cst.Attribute)):
                itself = self.accumulator_of(target)
                mentions = [n for n in _accumulator_mentions(value) if self.accumulator_of(n) == itself]
                if itself is not None and mentions:  # `running = running + loss`
                    yield self._store(statement, target, [value], exclude=mentions)

    def _store(self, node, target, values, is_update=False, exclude=()) -> Store:
        store = Store(node, target, values=list(values), is_update=is_update)
        for value in values:
            atoms, opaque = self.loss_atoms(value, frozenset(map(id, exclude)))
            store.atoms.extend(atoms)
            store.opaque |= opaque
        return store

    def accumulator_of(self, target: cst.CSTNode) -> Optional[AccumulatorKey]:
        if isinstance(target, cst.Subscript):
            return self.accumulator_of(target.value)
        if isinstance(target, cst.Name):
            key = self.key(target)
            return ("name", *key) if key else None
        if isinstance(target, cst.Attribute):
            if self._is_self(target.value):
                return ("attr", target.attr.value)
            return ("other", code_of(target))
        return None

    def _is_self(self, node: cst.CSTNode) -> bool:
        """The first parameter of the method the node is in."""
        function = next(
            (a for a in self.codemod.ancestors(node) if isinstance(a, (cst.FunctionDef, cst.Lambda, cst.ClassDef))),
            None,
        )
        if not isinstance(function, cst.FunctionDef) or not isinstance(
            self.parent(self.parent(function)), cst.ClassDef
        ):
            return False
        parameters = [*function.params.posonly_params, *function.params.params]
        return bool(parameters) and isinstance(node, cst.Name) and parameters[0].name.value == node.value

    def _kept_across_iterations(self, store: Store, accumulator: AccumulatorKey) -> bool:
        statement = self.statement_of(store.node)
        loop = self.codemod.innermost_loop(statement)
        if loop is None:
            # an attribute or a global stored in a function outlives each call of it
            in_function = any(isinstance(a, (cst.FunctionDef, cst.Lambda)) for a in self.codemod.ancestors(statement))
            outlives = accumulator[0] != "name" or isinstance(accumulator[1], GlobalScope)
            return in_function and outlives
        return not self._reset_in(loop, accumulator)

    def _reset_in(self, loop: Union[cst.For, cst.While], accumulator: AccumulatorKey) -> bool:
        """Is the accumulator assigned afresh by a statement that every iteration runs?"""
        for statement in _always_run(loop.body):
            if isinstance(statement, (cst.Assign, cst.AnnAssign)) and statement.value is not None:
                targets = (
                    [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
                )
                for target in targets:
                    if not isinstance(target, cst.Subscript) and self.accumulator_of(target) == accumulator:
                        if not any(
                            self.accumulator_of(n) == accumulator for n in _accumulator_mentions(statement.value)
                        ):
                            return True
        return False

    # -- 4. what later code does with the accumulator ---------------------------------

    def later_uses(self, accumulator: AccumulatorKey, stores: list[Store]) -> Verdict:
        """What the code does with the accumulator, apart from these stores."""
        return self._accumulator_verdict(accumulator, [store.node for store in stores])

    def _accumulator_verdict(self, accumulator: AccumulatorKey, skip=()) -> Verdict:
        if accumulator in self._following:
            return NOTHING
        self._following.add(accumulator)
        try:
            if accumulator[0] == "attr":
                return self._attribute_verdict(accumulator[1], skip)
            if accumulator[0] == "other":
                return unknown(f"{accumulator[1]} belongs to an object whose other uses cannot be seen")
            return self._variable_verdict((accumulator[1], accumulator[2]), skip)
        finally:
            self._following.discard(accumulator)

    def _variable_verdict(self, key: tuple, skip) -> Verdict:
        verdict = NOTHING
        seen: set[int] = set()
        for assignment in self.assignments(key):
            origin = self._origin(assignment.node, key[1])
            if origin is not None:
                return unknown(origin)
            for access in assignment.references:
                if id(access.node) in seen or self.is_inside(access.node, skip):
                    continue
                seen.add(id(access.node))
                verdict |= self.classify(access.node)
        return verdict

    def bound_value(self, target: cst.CSTNode) -> tuple[Optional[Expression], Optional[cst.CSTNode]]:
        """(value, statement) of a name bound by `=`, `with ... as` or tuple
        unpacking of a literal (`a, b = [], []`); value None when the code does
        not show it (a loop variable, an unpacked call, an argument)."""
        path: list[int] = []
        node, holder = target, self.parent(target)
        while isinstance(holder, cst.Element):
            container = self.parent(holder)
            path.append(next(i for i, e in enumerate(container.elements) if e is holder))
            node, holder = container, self.parent(container)
        if isinstance(holder, (cst.AssignTarget, cst.AsName)):
            holder = self.parent(holder)
        value = assigned_value(node, holder)
        for index in reversed(path):
            elements = value.elements if isinstance(value, (cst.Tuple, cst.List)) else ()
            if index >= len(elements) or any(isinstance(e, cst.StarredElement) for e in elements):
                return None, holder
            value = elements[index].value
        return value, holder

    def _origin(self, node: cst.CSTNode, name: str) -> Optional[str]:
        """Where an accumulator's value comes from, when someone else may hold it too."""
        if isinstance(node, cst.Param) or isinstance(self.parent(node), cst.Param):
            return f"{name} is an argument, and the caller's uses cannot be seen"
        value, holder = self.bound_value(node)
        if isinstance(holder, cst.AugAssign):
            return None
        if value is None:
            return f"{name} is bound by `{_first_line(self.statement_of(node))}`"
        if self._is_fresh(value) or any(isinstance(n, cst.Name) and n.value == name for n in walk(value)):
            return None
        return f"{name} is assigned {code_of(value)}, which others may also hold"

    def _is_fresh(self, value: Expression) -> bool:
        if is_number_literal(value) or isinstance(
            value, (cst.List, cst.Dict, cst.Set, cst.Tuple, cst.ListComp, cst.DictComp, cst.SetComp, cst.SimpleString)
        ):
            return True
        return isinstance(value, cst.Call) and self.codemod.is_call_to(value, FRESH_CALLS)

    def _attribute_verdict(self, attribute: str, skip) -> Verdict:
        verdict = NOTHING
        reads = 0
        for node in self.nodes.attributes:
            if node.attr.value != attribute or self.is_inside(node, skip):
                continue
            holder = self.parent(node)
            if isinstance(holder, cst.AssignTarget):
                statement = self.parent(holder)
                mentions_itself = any(
                    isinstance(n, cst.Attribute) and n.attr.value == attribute for n in walk(statement.value)
                )
                if not (self._is_fresh(statement.value) or mentions_itself):
                    return unknown(f"the attribute {attribute} is assigned {code_of(statement.value)}")
                continue
            use = self.classify(node)
            reads += use.need > Need.NONE
            verdict |= use
        if reads == 0:
            return unknown(f"the attribute {attribute} is not read in this file")
        return verdict

    # -- 4a. one use -------------------------------------------------------------------

    def classify(self, node: cst.CSTNode) -> Verdict:
        """What the use at `node` (an expression holding the stored values)
        needs of them."""
        holder = self.parent(node)
        if holder is None:
            return unknown("used where it cannot be followed")
        for kind, rule in _RULES:
            if isinstance(holder, kind):
                return rule(self, node, holder)
        return unknown(f"used in `{_first_line(self.statement_of(node))}`")

    def _in_attribute(self, node, attribute: cst.Attribute) -> Verdict:
        if attribute.value is not node:
            return NOTHING
        name = attribute.attr.value
        call = self.parent(attribute)
        called = isinstance(call, cst.Call) and call.func is attribute
        if name in AUTOGRAD_ATTRIBUTES:
            return GRAPH
        if not called:
            return TENSOR if name in TENSOR_FACTS else TENSOR | self.classify(attribute)
        if name in MUTATING_METHODS or name in SHAPE_METHODS:
            return NOTHING
        if name in ELEMENT_METHODS:
            return self.classify(call)
        if name in DETACHING_METHODS:
            return TENSOR
        return TENSOR | self.classify(call)  # a tensor method: its result carries the values

    def _in_subscript(self, node, subscript: cst.Subscript) -> Verdict:
        if subscript.value is not node:
            return unknown("used as an index")
        holder = self.parent(subscript)
        if isinstance(holder, (cst.AssignTarget, cst.Del)) or (
            isinstance(holder, cst.AugAssign) and holder.target is subscript
        ):
            return NOTHING
        return self.classify(subscript)

    def _in_arithmetic(self, node, operation) -> Verdict:
        if (
            isinstance(operation, cst.BinaryOperation)
            and isinstance(operation.operator, cst.Modulo)
            and isinstance(operation.left, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))
        ):
            return NUMBER  # "%.3f" % total
        return NUMBER | self.classify(operation)

    def _in_comparison(self, node, comparison) -> Verdict:
        operators = (
            [target.operator for target in comparison.comparisons]
            if isinstance(comparison, cst.Comparison)
            else [comparison.operator]
        )
        if all(isinstance(op, (cst.Is, cst.IsNot)) for op in operators):
            return NOTHING
        return NUMBER

    def _in_argument(self, node, argument: cst.Arg) -> Verdict:
        call = self.parent(argument)
        if argument.value is not node or not isinstance(call, cst.Call) or call.func is node:
            return unknown("used where it cannot be followed")
        names = self.codemod.qualified_names(call.func)
        callee = code_of(call.func)
        if names & AUTOGRAD_CALLS:
            return GRAPH
        if names & BUILTIN_NUMBER_SINKS:
            return NUMBER
        if names & BUILTIN_SHAPE_ONLY:
            return NOTHING
        if names & BUILTIN_CARRIERS:
            return NUMBER | self.classify(call)
        if any(q.startswith("torch.") for q in names):
            return TENSOR | self.classify(call)
        if any(q.startswith(NUMBER_MODULES) for q in names):
            return NUMBER
        method = self.method(call)
        if method in STORING_METHODS:
            target = self.accumulator_of(call.func.value)
            return self._accumulator_verdict(target) if target else unknown(f"stored into {code_of(call.func.value)}")
        if method in LOGGING_METHODS:
            return NUMBER
        parameter = self._parameter_for(call, argument)
        if parameter is not None:
            return self._follow_binding(parameter)
        return unknown(f"passed to {callee}()")

    def _parameter_for(self, call: cst.Call, argument: cst.Arg) -> Optional[cst.Name]:
        """The parameter of a function defined in this file that receives `argument`."""
        if not isinstance(call.func, cst.Name) or argument.star:
            return None
        scope = self.scope(call.func)
        definitions = [a.node for a in scope[call.func.value]] if scope is not None and call.func.value in scope else []
        if len(definitions) != 1 or not isinstance(definitions[0], cst.FunctionDef):
            return None
        parameters = definitions[0].params
        if argument.keyword is not None:
            found = [
                p for p in (*parameters.params, *parameters.kwonly_params) if p.name.value == argument.keyword.value
            ]
            return found[0].name if found else None
        index = [a for a in call.args if a.keyword is None].index(argument)
        ordered = [*parameters.posonly_params, *parameters.params]
        return ordered[index].name if index < len(ordered) else None

    def _follow_binding(self, target: cst.CSTNode) -> Verdict:
        """Uses of what a binding target (`x = ...`, `for x in ...`) receives."""
        if isinstance(target, (cst.Tuple, cst.List)):
            verdict = NOTHING
            for element in target.elements:
                verdict |= self._follow_binding(element.value)
            return verdict
        if isinstance(target, cst.Name):
            key = self.key(target)
            if key is None:
                return unknown(f"assigned to {target.value}")
            if ("name", *key) in self._following:
                return NOTHING
            self._following.add(("name", *key))
            try:
                verdict = NOTHING
                for read in self._reads_of(target, key):
                    verdict |= self.classify(read)
                return verdict
            finally:
                self._following.discard(("name", *key))
        accumulator = self.accumulator_of(target)
        if accumulator is not None:
            return self._accumulator_verdict(accumulator)
        return unknown(f"assigned to {code_of(target)}")

    def _reads_of(self, target: cst.Name, key: tuple) -> Iterator[cst.CSTNode]:
        """The reads of a variable that can see the value `target` binds: in a
        `for` loop's body for its variable, else those after the binding, and
        those in a loop around it (they see it on the next iteration)."""
        reads = {id(a.node): a.node for assignment in self.assignments(key) for a in assignment.references}
        binder = target
        while isinstance(self.parent(binder), (cst.Element, cst.Tuple, cst.List)):
            binder = self.parent(binder)
        holder = self.parent(binder)
        if isinstance(holder, (cst.Param, cst.CompFor)):
            yield from reads.values()
            return
        if isinstance(holder, cst.For) and holder.target is binder:
            yield from (read for read in reads.values() if self.is_inside(read, [holder]))
            return
        statement = self.statement_of(target)
        end = self.codemod.get_metadata(PositionProvider, statement).end
        loop = self.codemod.innermost_loop(statement)
        for read in reads.values():
            start = self.codemod.get_metadata(PositionProvider, read).start
            if (start.line, start.column) >= (end.line, end.column) or (
                loop is not None and self.is_inside(read, [loop.body])
            ):
                yield read

    def _in_assignment(self, node, statement) -> Verdict:
        if isinstance(statement, cst.AugAssign):
            return NOTHING if statement.target is node else self._follow_binding(statement.target)
        if getattr(statement, "value", None) is not node:
            return NOTHING  # the node is (part of) a target
        targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
        verdict = NOTHING
        for target in targets:
            verdict |= self._follow_binding(target)
        return verdict

    def _in_loop_header(self, node, loop) -> Verdict:
        if loop.iter is not node:
            return NOTHING
        return self._follow_binding(loop.target)

    def _in_return(self, node, statement: cst.Return) -> Verdict:
        function = next(
            (a for a in self.codemod.ancestors(statement) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None
        )
        if not isinstance(function, cst.FunctionDef):
            return unknown("returned")
        if ("return", id(function)) in self._following:
            return NOTHING
        callers = self._calls_of(function)
        if not callers:
            return unknown(f"returned from {function.name.value}(), which this file does not call")
        self._following.add(("return", id(function)))
        try:
            verdict = NOTHING
            for call in callers:
                verdict |= (
                    self.classify(call)
                    if isinstance(call, cst.Call)
                    else unknown(f"{function.name.value} is passed around")
                )
            return verdict
        finally:
            self._following.discard(("return", id(function)))

    def _calls_of(self, function: cst.FunctionDef) -> list[cst.CSTNode]:
        name = function.name.value
        is_method = isinstance(self.parent(self.parent(function)), cst.ClassDef)
        if is_method:
            return [
                self.parent(a)
                for a in self.nodes.attributes
                if a.attr.value == name and isinstance(self.parent(a), cst.Call)
            ]
        scope = self.scope(function)
        uses = (
            [access.node for a in scope[name] if a.node is function for access in a.references]
            if scope is not None
            else []
        )
        return [
            self.parent(n) if isinstance(self.parent(n), cst.Call) and self.parent(n).func is n else n for n in uses
        ]

    def _in_element(self, node, element) -> Verdict:
        holder = self.parent(element)
        if isinstance(element, cst.DictElement) and element.value is not node:
            return NOTHING  # a key
        return self.classify(holder)

    def _in_comprehension(self, node, comprehension) -> Verdict:
        if getattr(comprehension, "elt", None) is node or getattr(comprehension, "value", None) is node:
            return self.classify(comprehension)
        return NOTHING

    def _carried(self, node, holder) -> Verdict:
        return self.classify(holder)


def _number(_analysis, _node, _holder) -> Verdict:
    return NUMBER


def _nothing(_analysis, _node, _holder) -> Verdict:
    return NOTHING


def _escapes(what: str):
    return lambda _analysis, _node, _holder: unknown(what)


_RULES = (
    (cst.Attribute, _Analysis._in_attribute),
    (cst.Subscript, _Analysis._in_subscript),
    (cst.Arg, _Analysis._in_argument),
    ((cst.BinaryOperation, cst.UnaryOperation), _Analysis._in_arithmetic),
    ((cst.Comparison, cst.ComparisonTarget), _Analysis._in_comparison),
    ((cst.Assign, cst.AnnAssign, cst.AugAssign, cst.AssignTarget), _Analysis._in_assignment),
    ((cst.For, cst.CompFor), _Analysis._in_loop_header),
    (cst.Return, _Analysis._in_return),
    ((cst.Element, cst.DictElement, cst.StarredElement), _Analysis._in_element),
    ((cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp), _Analysis._in_comprehension),
    ((cst.BooleanOperation, cst.IfExp), _Analysis._carried),
    ((cst.FormattedStringExpression, cst.If, cst.While, cst.Assert, cst.CompIf), _number),
    ((cst.Expr, cst.Del, cst.Global, cst.Nonlocal), _nothing),
    ((cst.Yield, cst.Await, cst.Lambda), _escapes("yielded or used in a lambda")),
)


def _always_run(block: cst.BaseSuite) -> Iterator[cst.BaseSmallStatement]:
    """The small statements a block runs every time it runs (those in `with`
    and `try` bodies included, not those behind a condition or a loop)."""
    for statement in getattr(block, "body", ()):
        if isinstance(statement, cst.SimpleStatementLine):
            yield from statement.body
        elif isinstance(statement, cst.BaseSmallStatement):
            yield statement
        elif isinstance(statement, (cst.With, cst.Try)):
            yield from _always_run(statement.body)


def _first_line(node: Optional[cst.CSTNode]) -> str:
    text = code_of(node).strip().splitlines()[0] if node is not None else "?"
    return text if len(text) <= 60 else text[:57] + "..."


def _keyword(call: cst.Call, name: str) -> Optional[cst.Arg]:
    return next((arg for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def _names(node: cst.CSTNode) -> Iterator[cst.Name]:
    return (n for n in walk(node) if isinstance(n, cst.Name))


def _accumulator_mentions(value: cst.CSTNode) -> list[Expression]:
    """The names and attributes a value reads (`running` in `running + loss`)."""
    mentions = []
    for node in walk(value):
        if isinstance(node, (cst.Name, cst.Attribute)):
            mentions.append(node)
    return mentions


def _arithmetic_parts(value: Expression) -> Optional[list[Expression]]:
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


def _only_atoms_and_numbers(value: Expression, atoms: set) -> bool:
    if value in atoms or is_number_literal(value):
        return True
    if isinstance(value, cst.BinaryOperation):
        return _only_atoms_and_numbers(value.left, atoms) and _only_atoms_and_numbers(value.right, atoms)
    if isinstance(value, cst.UnaryOperation):
        return _only_atoms_and_numbers(value.expression, atoms)
    return False


@dataclass
class _Nodes:
    """The nodes the analysis looks at, gathered in one pass."""

    calls: list[cst.Call] = field(default_factory=list)
    attributes: list[cst.Attribute] = field(default_factory=list)
    bindings: list[tuple[cst.CSTNode, Expression, cst.CSTNode]] = field(
        default_factory=list
    )  # (target, value, statement)
