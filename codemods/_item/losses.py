"""Which names hold losses: the tensors a backward call differentiates, what
they are computed from and what is computed from them; and the loss
expressions a stored value is made of.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Union

import libcst as cst

from .._base import walk

# Literals whose items carry their values unchanged.
CONTAINERS = (cst.Dict, cst.List, cst.Tuple, cst.Set)
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
        if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, cst.Call):
            self._derive_unpacked(target, value)
            return
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
        if atoms and isinstance(value, CONTAINERS):
            self.carriers.add(key)  # `log = {"loss": loss}`: a container that holds a loss, not a loss
        elif atoms:
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
        self, value: Expression, exclude: frozenset = frozenset(), carried: Optional[list] = None
    ) -> tuple[list[tuple[Expression, bool]], bool]:
        """The loss expressions a stored value is made of, each with whether it is
        known to be 0-d, and whether a loss also reaches the value some other way.
        `exclude`: ids of nodes that are not to count (the accumulator itself).
        A container variable (`log` after `log = {"loss": loss}`) is made of the
        losses in its literal; `carried` collects the targets of those literals."""
        atoms: list[tuple[Expression, bool]] = []
        opaque = self._scan(value, atoms, exclude, carried if carried is not None else [])
        return atoms, opaque

    def _scan(self, value: Expression, atoms: list, exclude: frozenset, carried: list) -> bool:
        if is_detaching(value) or id(value) in exclude:
            return False
        if isinstance(value, cst.Name) and self.key(value) in self.carriers and self.key(value) not in self.losses:
            literal = self._carried_literal(value)
            if literal is None:
                return True  # which literal it holds here cannot be seen
            carried.append(literal[1])
            return self._scan(literal[0], atoms, exclude, carried)
        atom = self._atom(value, exclude)
        if atom is not None:
            if atom == "ambiguous":
                return True
            atoms.append((value, atom))
            return False
        parts = arithmetic_parts(value)
        if parts is not None:
            return any([self._scan(part, atoms, exclude, carried) for part in parts])
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
        if isinstance(value, cst.Call):
            returned = self._returned_loss(value)
            if returned is not None:
                return returned
        if isinstance(value, cst.Call) and self.method(value) is not None:
            inner = self._atom(value.func.value, exclude)
            if inner is None or inner == "ambiguous":
                return inner
            if value.func.attr.value in REDUCTIONS and not value.args:
                return True
            if value.func.attr.value in SAME_VALUE_METHODS:
                return inner
        return None

    def _carried_literal(self, name: cst.Name) -> Optional[tuple[Expression, cst.CSTNode]]:
        """(literal, target) of the one container literal that reaches this
        read of a container variable."""
        definitions = self.definitions(name)
        if len(definitions) != 1:
            return None
        value, _ = self.bound_value(definitions[0])
        return (value, definitions[0]) if isinstance(value, CONTAINERS) else None

    def _returned_loss(self, call: cst.Call) -> Union[bool, str, None]:
        """For a call of a function of this file that always returns a loss
        (`train_step(model, batch)`, `self.train_step(batch)`): whether that
        loss is known to be 0-d, or "ambiguous"; None otherwise."""
        returned = self._always_returned(call)
        return self._common_kind(returned) if returned is not None else None

    def _always_returned(self, call: cst.Call, width: Optional[int] = None) -> Optional[list]:
        """What a function of this file that the call runs returns, one value
        per `return`, when every path ends in a `return` of a value (of a tuple
        of `width` items, with `width`); None otherwise."""
        function = self._called_function(call)
        if function is None or function.decorators:
            return None
        body = list(walk(function.body, into_definitions=False))
        returns = [node.value for node in body if isinstance(node, cst.Return)]
        if not returns or not _ends_in_return(function) or any(isinstance(n, (cst.Yield, cst.Await)) for n in body):
            return None
        if width is not None and not all(_is_tuple_of(value, width) for value in returns):
            return None
        return returns

    def _common_kind(self, values: list) -> Union[bool, str, None]:
        """Whether every value is a loss: all known 0-d, "ambiguous", or None
        (some value is not a loss)."""
        if any(value is None for value in values):
            return None
        key = tuple(id(value) for value in values)
        if key in self._returning:
            return None
        self._returning.add(key)
        try:
            kinds = [self._atom(value) for value in values]
        finally:
            self._returning.discard(key)
        if any(kind is None for kind in kinds):
            return None
        return "ambiguous" if "ambiguous" in kinds else all(kinds)

    def _derive_unpacked(self, target: cst.CSTNode, value: cst.Call) -> None:
        """`loss, accuracy = train_step(...)` where every return of the
        function is a tuple with a loss in that place: the name is a loss."""
        elements = target.elements
        returned = self._always_returned(value, width=len(elements))
        if returned is None:
            return
        for index, element in enumerate(elements):
            name = element.value
            if not isinstance(name, cst.Name) or id(name) in self._loss_definitions:
                continue
            kind = self._common_kind([tuple_value.elements[index].value for tuple_value in returned])
            if kind is not None and kind != "ambiguous":
                self._loss_definitions.add(id(name))
                self._add_loss(self.key(name), kind)

    def _returns_a_loss_somewhere(self, call: cst.Call) -> bool:
        """Does a function of this file that the call runs return a loss in
        some value (`return loss, prediction`, `return None` on another path)?"""
        function = self._called_function(call)
        if function is None or ("reaches", id(function)) in self._returning:
            return False
        self._returning.add(("reaches", id(function)))
        try:
            return any(
                isinstance(node, cst.Return) and node.value is not None and self._reaches_loss(node.value, frozenset())
                for node in walk(function.body, into_definitions=False)
            )
        finally:
            self._returning.discard(("reaches", id(function)))

    def _called_function(self, call: cst.Call) -> Optional[cst.FunctionDef]:
        """The one function of this file a call runs: `name(...)` bound once by
        `def`, or `self.name(...)` in a method, with `name` a method of the class."""
        func = call.func
        if isinstance(func, cst.Name):
            bindings = self.codemod.script.bindings_of(func.value, func)
            if len(bindings) == 1 and isinstance(bindings[0].node, cst.FunctionDef):
                return bindings[0].node
            return None
        if isinstance(func, cst.Attribute) and self._is_self(func.value):
            # the one method of that name in the file: a subclass's override could run instead
            found = [
                scope.node
                for scope in self.codemod.script.scopes
                if scope.enclosing_class is not None and scope.node.name.value == func.attr.value
            ]
            method = next(a for a in self.codemod.ancestors(call) if isinstance(a, cst.FunctionDef))
            klass = self.parent(self.parent(method))
            return found[0] if len(found) == 1 and self.parent(self.parent(found[0])) is klass else None
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
            if self._returns_a_loss_somewhere(value):
                return True
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


def _ends_in_return(function: cst.FunctionDef) -> bool:
    """Its last statement is a `return`: it never falls off its end with None."""
    body = function.body.body
    last = body[-1] if body else None
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], cst.Return)


def _is_tuple_of(value: Optional[cst.BaseExpression], width: int) -> bool:
    return (
        isinstance(value, cst.Tuple)
        and len(value.elements) == width
        and not any(isinstance(e, cst.StarredElement) for e in value.elements)
    )
