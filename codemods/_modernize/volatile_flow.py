"""Which values a `volatile=True` region makes from the volatile value, and
where values made there go afterwards.

In PyTorch 0.3 a value computed from a volatile one was volatile (no graph)
and `backward()` through it raised; a value computed there from other
tensors kept its graph. Under `torch.no_grad()` every value made there has
no graph. So the two differ only for values of the region made without the
volatile value that still carry a graph, and for code after the region that
backpropagates through the region's values (which PyTorch 0.3 refused)."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import walk
from .._item.syntax import AUTOGRAD_CALLS, DETACHING_METHODS, TENSOR_FACTS, method_name
from ..script import ScriptModel
from .syntax import Expression, plain_target_names, root_name, target_value_pairs

# How the region's binding of a name compares with PyTorch 0.3.
VOLATILE = "volatile"  # made from the volatile value: no graph then, none now
NO_GRAPH = "no-graph"  # a number, `.data`, a batch: no graph either way
GRAPH = "graph"  # may have kept a graph then, has none now

# Uses of a tensor that give a number or metadata, not a value with its graph.
NUMBER_METHODS = DETACHING_METHODS | {"size", "dim", "numel", "nelement", "get_device"}
NUMBER_FUNCTIONS = frozenset({"builtins.len", "builtins.int", "builtins.float", "builtins.bool"})
BACKWARD_METHODS = frozenset({"backward", "manual_backward"})


class RegionValues:
    """The kinds of the bindings that `statements` make, in order, given the
    `Variable(..., volatile=True)` calls among them (or before them)."""

    def __init__(self, model: ScriptModel, values, seeds: set, statements: list, volatile_names: set) -> None:
        self.model, self.values, self.seeds = model, values, seeds
        self.kinds: dict[str, set[str]] = {}  # name -> kinds of its bindings in the statements
        self.made_at: dict[str, cst.CSTNode] = {}  # name -> its first binding that may keep a graph
        self.last_use: Optional[int] = None  # index of the last statement reading a volatile value
        self._volatile = set(volatile_names)
        for index, statement in enumerate(statements):
            before = set(self._volatile)
            for node in walk(statement, into_definitions=False):
                self._bind(node)
            if self._reads(statement, before | self._volatile):
                self.last_use = index

    def _reads(self, statement: cst.CSTNode, names: set) -> bool:
        return any(
            node in self.seeds or isinstance(node, cst.Name) and node.value in names
            for node in walk(statement, into_definitions=False)
        )

    # -- bindings ------------------------------------------------------------------------

    def _bind(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.Assign):
            for target in node.targets:
                self._assign(target.target, node.value)
        elif isinstance(node, cst.AugAssign):
            self._augment(node)
        elif isinstance(node, cst.For):
            carries = self.carries(node.iter)
            counts = self.model.is_call_to(node.iter, {"builtins.range"})
            for name in (n for n in walk(node.target) if isinstance(n, cst.Name)):
                kind = VOLATILE if carries else NO_GRAPH if counts or self.values.is_grad_free(name) else GRAPH
                self._record(name.value, kind, node)
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            self._assign(node.asname.name, node.item)

    def _assign(self, target: cst.CSTNode, value: Expression) -> None:
        pairs = list(target_value_pairs(target, value))
        if not pairs:  # `a, b = value`: each part is like the whole
            for name in plain_target_names(target):
                self._record(name, self._kind(value), target)
            return
        for part, part_value in pairs:
            if isinstance(part, cst.Name):
                self._record(part.value, self._kind(part_value), part)
            elif isinstance(part, (cst.Attribute, cst.Subscript)):
                self._store_into(part, part_value)

    def _store_into(self, target: cst.CSTNode, value: Expression) -> None:
        """`x[i] = v`, `x.attr = v`: `x` is volatile after a volatile store,
        and no longer after `x.volatile = False` (how 0.3 code cut it)."""
        holder = root_name(target)
        if holder is None:
            return
        if isinstance(target, cst.Attribute) and target.attr.value == "volatile":
            self._volatile.discard(holder)
        elif self.carries(value):
            self._volatile.add(holder)

    def _augment(self, node: cst.AugAssign) -> None:
        target = node.target
        if not isinstance(target, cst.Name):
            self._store_into(target, node.value)
            return
        if self.carries(node.value) or target.value in self._volatile:
            kind = VOLATILE
        elif self.values.is_detached(node.value) and self.values.is_detached(target):
            kind = NO_GRAPH
        else:
            kind = GRAPH
        self._record(target.value, kind, node)

    def _kind(self, value: Expression) -> str:
        if self.carries(value):
            return VOLATILE
        if self.values.is_detached(value) or self.values.is_grad_free(value):
            return NO_GRAPH
        return GRAPH

    def _record(self, name: str, kind: str, at: cst.CSTNode) -> None:
        self.kinds.setdefault(name, set()).add(kind)
        if kind == VOLATILE:
            self._volatile.add(name)
        else:
            self._volatile.discard(name)
        if kind == GRAPH:
            self.made_at.setdefault(name, at)

    # -- reads ---------------------------------------------------------------------------

    def kind_of(self, value: Expression) -> Optional[str]:
        """VOLATILE for a name that every binding in the statements makes from the volatile value."""
        if isinstance(value, cst.Name) and self.kinds.get(value.value) == {VOLATILE}:
            return VOLATILE
        return None

    def carries(self, value: Expression) -> bool:
        """`value` is computed from a volatile value as a tensor (not only its
        size, its `.data` or a number read from it)."""
        return any(
            node in self.seeds
            or isinstance(node, cst.Name) and node.value in self._volatile and not as_number(self.model, node, value)
            for node in walk(value)
        )


def as_number(model: ScriptModel, node: cst.CSTNode, top: cst.CSTNode) -> bool:
    """Between `node` and `top` (or its statement), the tensor is only read
    for a number or metadata: `x.size(0)`, `x.data`, `len(x)`, `x.item()`."""
    child = node
    for parent in model.ancestors(node):
        if child is top or isinstance(parent, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return False
        if isinstance(parent, cst.Attribute) and parent.value is child:
            if parent.attr.value in TENSOR_FACTS:
                return True
            holder = model.parent(parent)
            if parent.attr.value in NUMBER_METHODS and isinstance(holder, cst.Call) and holder.func is parent:
                return True
        if isinstance(parent, cst.Arg) and model.is_call_to(model.parent(parent), NUMBER_FUNCTIONS):
            return True
        child = parent
    return False


def backward_through(model: ScriptModel, read: cst.Name) -> Optional[cst.Call]:
    """The backward call (`x.backward()`, `torch.autograd.grad(...)`) whose
    statement differentiates through `read`, if any."""
    if as_number(model, read, None):
        return None
    for ancestor in model.ancestors(read):
        if isinstance(ancestor, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return None
        if isinstance(ancestor, cst.Call) and (
            method_name(ancestor) in BACKWARD_METHODS or model.is_call_to(ancestor, AUTOGRAD_CALLS)
        ):
            return ancestor
    return None


def assignment_of(model: ScriptModel, read: cst.Name) -> Optional[cst.BaseSmallStatement]:
    """The `x = ...` or `x += ...` whose value holds `read` as a tensor."""
    child: cst.CSTNode = read
    for ancestor in model.ancestors(read):
        if isinstance(ancestor, (cst.Assign, cst.AugAssign)):
            held = child is ancestor.value and not as_number(model, read, ancestor.value)
            return ancestor if held else None
        if isinstance(ancestor, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return None
        child = ancestor
    return None
