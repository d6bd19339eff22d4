"""Which values provably hold more than one number, so that `x.data[0]`
on them is valid indexing (their first item) and needs no finding."""

from __future__ import annotations

import libcst as cst

from .._base import keyword_arg
from .._item.syntax import SAME_VALUE_METHODS, method_name, positional_args
from ..script import vocabulary as v
from ..script.scopes import Binding
from .syntax import Expression, assigned, literal_flag

# Factories whose positional arguments are the sizes of the new tensor.
SIZED_FACTORIES = frozenset({f"torch.{n}" for n in ("zeros", "ones", "empty", "rand", "randn")})
PARAMETER_ATTRIBUTES = frozenset({"weight", "bias"})  # a layer's parameters have at least one dimension


class Shapes:
    """What `Values` knows about shapes: batches, slices, layers' parameters."""

    def is_batch(self, value: Expression, depth: int = 0) -> bool:
        """`value` provably has at least one dimension."""
        if depth > 6:
            return False
        if isinstance(value, cst.Subscript):
            return any(isinstance(e.slice, cst.Slice) for e in value.slice) and len(value.slice) == 1
        if isinstance(value, cst.Attribute):
            return value.attr.value in PARAMETER_ATTRIBUTES or (
                value.attr.value == "data" and self.is_batch(value.value, depth + 1)
            )
        if isinstance(value, cst.Call):
            return self._batch_call(value, depth)
        if isinstance(value, cst.Name):
            bindings = self.model.bindings_of(value.value, value)
            return bool(bindings) and value.value not in self._global_names and all(
                self._batch_binding(b, depth) for b in bindings
            )
        return False

    def _batch_call(self, call: cst.Call, depth: int) -> bool:
        positional = positional_args(call)
        if self.model.is_call_to(call, SIZED_FACTORIES):
            sizes = [a.value for a in positional]
            return bool(sizes) and all(isinstance(size, cst.Integer) and size.evaluated_value > 0 for size in sizes)
        if self.model.is_call_to(call, v.VARIABLE):
            return len(positional) == 1 and self.is_batch(positional[0].value, depth + 1)
        if method_name(call) in SAME_VALUE_METHODS and not self._is_module_function(call):
            return self.is_batch(call.func.value, depth + 1)
        # a model's output is its batch of predictions; a loss without reduction is one value per sample
        return self.model.is_model(call.func) or self._keeps_samples(call)

    def _keeps_samples(self, call: cst.Call) -> bool:
        """`F.mse_loss(..., reduction="none")`, or a criterion made with `reduce=False`."""
        if self.loss_prefix(call) is not None:
            return self._is_functional(call) and _unreduced(call)
        bindings = self.model.bindings_of(call.func.value, call.func) if isinstance(call.func, cst.Name) else []
        made = [assigned(b) if b.kind == "assign" else None for b in bindings]
        return bool(made) and all(
            isinstance(m, cst.Call) and self.loss_prefix(m) is not None and not self._is_functional(m) and _unreduced(m)
            for m in made
        )


    def _batch_binding(self, binding: Binding, depth: int) -> bool:
        if binding.kind == "for" and isinstance(binding.statement, cst.For):
            return self._iterates_a_loader(binding.statement) and self._is_batch_part(binding)
        if binding.kind == "param":
            arguments = self._arguments(binding)
            return bool(arguments) and all(self.is_batch(a, depth + 1) for a in arguments)
        value = assigned(binding) if binding.kind == "assign" else None
        return value is not None and self.is_batch(value, depth + 1)

    def _is_batch_part(self, binding: Binding) -> bool:
        """Not the index of `for i, (x, y) in enumerate(loader)`."""
        target = binding.statement.target
        if isinstance(target, cst.Tuple) and target.elements and isinstance(target.elements[0].value, cst.Name):
            loop_iter = binding.statement.iter
            counted = isinstance(loop_iter, cst.Call) and self.model.is_call_to(loop_iter, {"builtins.enumerate"})
            return not (counted and target.elements[0].value is binding.node)
        return True


def _unreduced(call: cst.Call) -> bool:
    reduction, reduce = keyword_arg(call, "reduction"), keyword_arg(call, "reduce")
    if reduction is not None:
        return isinstance(reduction.value, cst.SimpleString) and reduction.value.evaluated_value == "none"
    return reduce is not None and literal_flag(reduce.value) is False
