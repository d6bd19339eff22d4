"""Which names hold losses: the tensors a backward call differentiates, what
they are computed from and what is computed from them; and the loss
expressions a stored value is made of.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Union

import libcst as cst

from .._base import walk
from .syntax import (
    SAME_VALUE_METHODS,
    REDUCTIONS,
    SCALING_METHODS,
    NUMBER_MODULES,
    STACKING_CALLS,
    TENSOR_REDUCING_CALLS,
    NUMBER_METHODS,
    NUMBER_FUNCTIONS,
    TENSOR_ROOT,
    OPERAND_ROOT,
    LIST_ROOT,
    Expression,
    positional_args,
    is_number_literal,
    is_detaching,
    always_run,
    keyword,
    names_in,
    arithmetic_parts,
    only_atoms_and_numbers,
)


class Losses:
    """Part of the analysis (see `analysis.Analysis`): names, scopes and losses."""

    # -- metadata helpers ---------------------------------------------------------

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.codemod.parent(node)

    def method(self, call: cst.Call) -> Optional[str]:
        """`x.name(...)` called on a value, not a function of an imported module."""
        if not isinstance(call.func, cst.Attribute):
            return None
        receiver = call.func.value
        if isinstance(receiver, (cst.Name, cst.Attribute)) and self.nodes.is_module_or_builtin(receiver):
            return None  # `torch.stack(...)`, `F.mse_loss(...)`: a module's function
        return call.func.attr.value

    def key(self, name: cst.Name) -> Optional[tuple]:
        """The variable `name` refers to: (defining scope, name)."""
        return (self.nodes.home(name), name.value)

    def assignments(self, key: tuple) -> list:
        """The bindings of the variable (each `.node` is the target, Param or definition)."""
        scope, name = key
        return scope.bindings.get(name, [])

    def reads(self, key: tuple) -> list[cst.Name]:
        scope, name = key
        return self.nodes.reads(name, scope)

    def is_after(self, node: cst.CSTNode, statement: cst.CSTNode) -> bool:
        """Does `node` come after the whole of `statement` in the source?"""
        order = self.codemod.script.index.order
        return order[node] > order[statement] and not self.is_inside(node, [statement])

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
        for step in self.codemod.script.training_steps:
            self._backward_roots(step.backward)
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
        """The losses a backward call of the script model differentiates."""
        method = self.method(call)
        positional = positional_args(call)
        if method == "backward":
            # `loss.backward()`; a gradient argument means a loss that is not 0-d;
            # `accelerator.backward(loss)` passes the loss itself.
            self._add_roots(call.func.value, not positional and keyword(call, "gradient") is None)
            if positional:
                self._add_roots(positional[0].value, False)
        elif method == "manual_backward" and positional:
            self._add_roots(positional[0].value, True)
        elif self.codemod.is_call_to(call, {"torch.autograd.backward"}):
            tensors = positional[0] if positional else keyword(call, "tensors")
            if tensors is not None:
                scalar = len(positional) < 2 and keyword(call, "grad_tensors") is None
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
        if key is None or any(self.key(n) == key for n in names_in(value)):
            return  # `running = running + loss` accumulates: that is a store
        atoms, _ = self.loss_atoms(value)
        if atoms:
            self._loss_definitions.add(id(target))
            self._add_loss(
                key, all(scalar for _, scalar in atoms) and only_atoms_and_numbers(value, {a for a, _ in atoms})
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
        parts = arithmetic_parts(value)
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
            smalls = list(always_run(statement.body))
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
        parts = arithmetic_parts(value)
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
        parts = [value.left, value.right] if isinstance(value, cst.BinaryOperation) else arithmetic_parts(value)
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
                and binder in {n.value for n in names_in(holder.target)}
            ):
                yield holder.target
                return
            elif binder is not None and isinstance(holder, cst.With):
                items = [
                    item for item in holder.items if item.asname and binder in {n.value for n in names_in(item.asname)}
                ]
                if items:
                    yield items[-1]
                    return
            current = holder
