"""`loss.data[0]` (AM220) and running totals of `loss.data` read as
`total[0]` (AM223): which values provably hold one number."""

from __future__ import annotations

from typing import Iterable, Iterator, Optional

import libcst as cst

from .._base import code_of, walk
from .._item.syntax import REDUCTIONS, SAME_VALUE_METHODS, is_number_literal, method_name, positional_args
from ..script.scopes import Binding
from .syntax import Expression, assigned, bound_names, reads_outside

NUMBER_BUILTINS = frozenset({"builtins.len", "builtins.int", "builtins.float"})
NUMBER_METHODS = frozenset({"item", "numel", "dim"})
ZERO_D_METHODS = REDUCTIONS | {"norm"}
ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power)
AUGMENTED_ARITHMETIC = (cst.AddAssign, cst.SubtractAssign, cst.MultiplyAssign, cst.DivideAssign)

# How sure the analysis is that a value holds one number.
ZERO_D = "0-d"  # a 0-dim tensor
ONE = "one"  # one number, maybe of shape (1,): `.backward()` without a gradient ran on it
NUMBER = "number"  # a Python number
_CYCLE = "cycle"  # the value being worked out itself (`total = total + x`)
_NONE = "none"  # `loss = None` before the loop: `.data[0]` on it fails whatever it is, so it tells nothing
_TENSOR_LEVELS = (ZERO_D, ONE)


class DataIndexPlans:
    """The planning of AM220 and AM223, a part of the `Modernize` codemod."""

    def _plan_one_number_reads(self) -> None:
        for node in self.model.index.nodes_of(cst.Subscript):
            if not _is_index_zero(node) or node in self._replace:
                continue
            holder = node.value
            if isinstance(holder, cst.Attribute) and holder.attr.value == "data":
                level = self.values.level(holder.value)
                if level is None and isinstance(holder.value, cst.Name) and self.values.backpropagated_before(holder.value):
                    level = ONE
                if level in _TENSOR_LEVELS:
                    self._one_number_read(node, code_of(holder.value), "item")
                elif level is None and not self.values.is_batch(holder.value):
                    self.report(node, "AM220", f"{code_of(node)}: if {code_of(holder.value)} holds one number (a loss, "
                                "a sum), indexing it raises IndexError on a 0-dim tensor since PyTorch 0.4: write "
                                f"{code_of(holder.value)}.item(); if it holds a batch or a row, its first item can stay")
            elif isinstance(holder, cst.Name) and self.values.is_data_total(holder) and self.values.level(holder) == ZERO_D:
                self._one_number_read(node, holder.value, "item")

    def _one_number_read(self, subscript: cst.Subscript, tensor: str, how: str) -> None:
        if self.fix(subscript, "AM220", f"{code_of(subscript)} indexes a tensor that holds one number, which raises "
                    f"IndexError on a 0-dim tensor since PyTorch 0.4: {tensor}.item()"):
            self._replace[subscript] = how

    # AM223 ---------------------------------------------------------------------------

    def _plan_accumulators(self) -> None:
        for total, stores, reads in self.values.data_totals():
            if not reads or any(not _is_index_zero(self.model.parent(r)) for r in reads):
                continue
            atoms = [atom for store in stores for atom in self.values.data_atoms(store)]
            if any(atom is None for atom in atoms):
                continue
            first = stores[0]
            if not self.fix(first, "AM223", f"{total} adds up loss.data tensors and is read only as {total}[0], which "
                            f"raises IndexError on a 0-dim tensor since PyTorch 0.4: add up loss.item() and read {total}"):
                continue
            for atom in atoms:
                self._replace[atom] = "data-item"
            for read in reads:
                self._replace[self.model.parent(read)] = "bare"


class OneNumber:
    """What `Values` knows about one number: whether an expression holds one,
    and which running totals add up `.data` values."""

    def level(self, value: Expression) -> Optional[str]:
        """ZERO_D, ONE or NUMBER when the value provably holds one number; else None."""
        if is_number_literal(value) and not (isinstance(value, cst.Name)):
            return NUMBER
        if isinstance(value, cst.Name):
            return self._name_level(value)
        if isinstance(value, cst.Attribute) and value.attr.value == "data":
            return self._tensor_level(value.value)
        if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, (cst.Minus, cst.Plus)):
            return self.level(value.expression)
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, ARITHMETIC):
            return _arithmetic(self.level(value.left), self.level(value.right))
        if isinstance(value, cst.Call):
            return self._call_level(value)
        return None

    def _tensor_level(self, value: Expression) -> Optional[str]:
        level = self.level(value)
        return level if level in _TENSOR_LEVELS else None

    def _call_level(self, call: cst.Call) -> Optional[str]:
        if self.model.is_call_to(call, NUMBER_BUILTINS):
            return NUMBER
        if self.is_reducing_loss_call(call):
            return ZERO_D
        positional = positional_args(call)
        if self.model.is_call_to(call, {"torch.sum", "torch.mean"}):
            return ZERO_D if len(call.args) == 1 and len(positional) == 1 else None
        returned = self._returned_level(call)
        if returned is not None:
            return returned
        method = method_name(call)
        if method is None or self._is_module_function(call):
            return None
        if method in NUMBER_METHODS or (method == "size" and len(positional) == 1):
            return NUMBER
        if method in ZERO_D_METHODS and not call.args:
            return ZERO_D
        if method in SAME_VALUE_METHODS:
            return self._tensor_level(call.func.value)
        return None

    def _name_level(self, name: cst.Name) -> Optional[str]:
        bindings = self.model.bindings_of(name.value, name)
        if not bindings or name.value in self._global_names:
            return None
        key = (id(bindings[0].scope), name.value)
        if key in self._in_progress:
            return _CYCLE
        if key not in self._levels:
            self._in_progress.add(key)
            try:
                level = _combine([self._binding_level(b) for b in bindings])
                if level is None and self._backpropagated_once(name.value, bindings):
                    level = ONE
            finally:
                self._in_progress.discard(key)
            self._levels[key] = level
        return self._levels[key]

    def _binding_level(self, binding: Binding) -> Optional[str]:
        if binding.kind == "augassign":
            statement = binding.statement
            return self.level(statement.value) if isinstance(statement.operator, AUGMENTED_ARITHMETIC) else None
        value = assigned(binding)
        if isinstance(value, cst.Name) and value.value == "None":
            return _NONE
        return self.level(value) if value is not None else None

    def _backpropagated_once(self, name: str, bindings: list[Binding]) -> bool:
        """Assigned once, and `name.backward()` (without a gradient) runs on
        it: it holds one number, or the backward call raises."""
        if len(bindings) != 1 or bindings[0].kind != "assign" or bindings[0].value is None:
            return False
        return any(_is_scalar_backward_of(call, name) for call in bindings[0].scope.calls)

    def backpropagated_before(self, name: cst.Name) -> bool:
        """`name.backward()` (without a gradient) runs before this read of
        `name`, in its block or one around it within the loop or function,
        with no assignment of `name` between: it holds one number, or that
        backward call raised."""
        child: cst.CSTNode = name
        for ancestor in self.model.ancestors(name):
            if isinstance(ancestor, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.CompFor)):
                return False  # an earlier iteration or call may have rebound it
            if isinstance(ancestor, (cst.IndentedBlock, cst.Module)):
                before = list(ancestor.body)
                for statement in reversed(before[: before.index(child)]):
                    if name.value in bound_names([statement]):
                        return False
                    if isinstance(statement, cst.SimpleStatementLine) and any(
                        isinstance(node, cst.Call) and _is_scalar_backward_of(node, name.value) for node in walk(statement)
                    ):
                        return True
            child = ancestor
        return False

    def _returned_level(self, call: cst.Call) -> Optional[str]:
        """The level of what the file's own function called here returns: one
        for all its `return` values, when its body ends in a return."""
        found = self.model.flow.callee(call, self.model.scope_of(call))
        if found is None or found[0].node.name.value == "__init__":
            return None
        function = found[0].node
        key = ("returns", function)
        if key in self._in_progress:
            return _CYCLE
        if key not in self._levels:
            self._in_progress.add(key)
            try:
                self._levels[key] = self._returns_level(function)
            finally:
                self._in_progress.discard(key)
        return self._levels[key]

    def _returns_level(self, function: cst.FunctionDef) -> Optional[str]:
        inside = list(walk(function.body, into_definitions=False))
        returns = [node for node in inside if isinstance(node, cst.Return)]
        last = function.body.body[-1] if function.body.body else None
        ends_in_return = isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], cst.Return)
        if not ends_in_return or any(r.value is None for r in returns) or any(isinstance(n, cst.Yield) for n in inside):
            return None
        return _combine([self.level(r.value) for r in returns])

    def is_data_total(self, name: cst.Name) -> bool:
        return any(self._adds_data(b) for b in self.model.bindings_of(name.value, name))

    def _adds_data(self, binding: Binding) -> bool:
        value = binding.statement.value if binding.kind == "augassign" else _self_addition(binding)
        return value is not None and any(
            isinstance(n, cst.Attribute) and n.attr.value == "data" for n in walk(value)
        )

    def data_totals(self) -> Iterator[tuple[str, list[cst.CSTNode], list[cst.Name]]]:
        """(name, the statements adding to it, its other reads) for each
        variable that only ever gets number literals and `.data` values
        added to it."""
        for scope in self.model.scopes:
            for name, bindings in scope.bindings.items():
                if name in self._global_names or "." in name or not any(self._adds_data(b) for b in bindings):
                    continue
                stores = []
                for binding in bindings:
                    if self._adds_data(binding):
                        stores.append(binding.statement)
                    elif not (binding.kind == "assign" and is_number_literal(binding.value or cst.Name("x"))):
                        break
                else:
                    yield name, stores, reads_outside(self.model, scope, name, stores)

    def data_atoms(self, statement: cst.CSTNode) -> list[Optional[cst.Attribute]]:
        """The `x.data` parts of what a store adds, each with x one number; a
        None in the list when another part may be a tensor."""
        value = statement.value
        if isinstance(statement, cst.Assign):
            value = _self_addition_value(statement)
        return list(self._atoms(value))

    def _atoms(self, value: Expression) -> Iterator[Optional[cst.Attribute]]:
        if isinstance(value, cst.Attribute) and value.attr.value == "data":
            yield value if self._tensor_level(value.value) is not None else None
        elif isinstance(value, cst.BinaryOperation) and isinstance(value.operator, ARITHMETIC):
            yield from self._atoms(value.left)
            yield from self._atoms(value.right)
        elif isinstance(value, cst.UnaryOperation):
            yield from self._atoms(value.expression)
        elif self.level(value) != NUMBER:
            yield None


def _self_addition(binding: Binding) -> Optional[Expression]:
    """`total = total + x`: the added value `x`; else None."""
    statement = binding.statement
    if binding.kind != "assign" or not isinstance(statement, cst.Assign):
        return None
    return _self_addition_value(statement, binding.name)


def _self_addition_value(statement: cst.Assign, name: Optional[str] = None) -> Optional[Expression]:
    target = statement.targets[0].target if len(statement.targets) == 1 else None
    if not isinstance(target, cst.Name) or (name is not None and target.value != name):
        return None
    value = statement.value
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add):
        if isinstance(value.left, cst.Name) and value.left.value == target.value:
            return value.right
        if isinstance(value.right, cst.Name) and value.right.value == target.value:
            return value.left
    return None


def _is_scalar_backward_of(call: cst.Call, name: str) -> bool:
    """`name.backward()`, maybe with keywords, but without a gradient."""
    func = call.func
    return (
        isinstance(func, cst.Attribute) and func.attr.value == "backward"
        and isinstance(func.value, cst.Name) and func.value.value == name
        and all(a.keyword is not None and a.keyword.value != "gradient" for a in call.args)
    )  # fmt: skip


def _combine(levels: Iterable[Optional[str]]) -> Optional[str]:
    """The level of a name from those of the values it is assigned."""
    levels = [level for level in levels if level not in (_CYCLE, _NONE)]
    if not levels or None in levels:
        return None
    tensors = [level for level in levels if level != NUMBER]
    if not tensors:
        return NUMBER
    return ONE if ONE in tensors else ZERO_D


def _arithmetic(left: Optional[str], right: Optional[str]) -> Optional[str]:
    if left is None or right is None:
        return None
    return _combine([left, right])


def _is_index_zero(node: Optional[cst.CSTNode]) -> bool:
    """`x[0]`."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return False
    index = node.slice[0].slice
    return isinstance(index, cst.Index) and isinstance(index.value, cst.Integer) and index.value.evaluated_value == 0
