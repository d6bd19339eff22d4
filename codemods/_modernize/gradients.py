"""Which values provably carry no gradient: what `Variable(t)` may become."""

from __future__ import annotations

import libcst as cst

from .._base import keyword_arg
from .._item.syntax import DETACHING_METHODS, is_number_literal, method_name
from ..script import vocabulary as v
from ..script.scopes import Binding
from .one_number import NUMBER
from .syntax import Expression, assigned, is_false, is_plain_literal

# Calls that make a new tensor without a gradient (unless told requires_grad=True).
_TENSOR_TYPES = ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Byte", "Char", "Bool")
TENSOR_FACTORIES = frozenset(
    {f"torch.{n}" for n in (
        "tensor", "Tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange",
        "linspace", "logspace", "eye", "from_numpy", "zeros_like", "ones_like", "empty_like", "full_like",
        "rand_like", "randn_like", "randint_like",
    )}
    | {f"torch.{t}Tensor" for t in _TENSOR_TYPES}
    | {f"torch.cuda.{t}Tensor" for t in _TENSOR_TYPES}
)  # fmt: skip
# Tensor methods whose result is a new tensor object, never the receiver.
NEW_TENSOR_METHODS = frozenset(
    {"clone", "detach", "new", "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "view", "view_as",
     "reshape", "expand", "expand_as", "repeat", "transpose", "permute", "t", "squeeze", "unsqueeze", "flatten",
     "narrow", "mean", "sum", "add", "sub", "mul", "div", "pow", "exp", "log", "abs", "neg", "sqrt"}
)  # fmt: skip


class Gradients:
    """What `Values` knows about gradients: new tensors, values without a graph."""

    def is_detached(self, value: Expression, seen: frozenset = frozenset()) -> bool:
        """A value without a graph: a number, or made from `.data`, `.item()`,
        `.detach()` by methods whose arguments have no graph either
        (`output.data.max(1)[1]`, `pred.eq(target.data).sum()`)."""
        if self.level(value) == NUMBER or is_plain_literal(value):
            return True
        if isinstance(value, cst.BinaryOperation):
            return self.is_detached(value.left, seen) and self.is_detached(value.right, seen)
        if isinstance(value, cst.Attribute):
            return value.attr.value == "data" or self.is_detached(value.value, seen)
        if isinstance(value, cst.Subscript):
            return self.is_detached(value.value, seen)
        if isinstance(value, cst.Call):
            method = method_name(value)
            if method is None or self._is_module_function(value):
                return False
            arguments_detached = all(self.is_detached(arg.value, seen) for arg in value.args)
            return arguments_detached and (method in DETACHING_METHODS or self.is_detached(value.func.value, seen))
        if isinstance(value, cst.Name) and value.value not in seen and value.value not in self._global_names:
            bindings = self.model.bindings_of(value.value, value)
            return bool(bindings) and all(
                b.kind in ("assign", "augassign")
                and (b.statement.value if b.kind == "augassign" else assigned(b)) is not None
                and self.is_detached(b.statement.value if b.kind == "augassign" else assigned(b), seen | {value.value})
                for b in bindings
            )
        return False

    def is_fresh(self, value: Expression) -> bool:
        """A new tensor object, without a gradient, that nothing else holds."""
        if isinstance(value, cst.Attribute):
            return value.attr.value == "data"
        if isinstance(value, cst.BinaryOperation):
            return self.is_grad_free(value.left) and self.is_grad_free(value.right)  # arithmetic makes a new tensor
        if isinstance(value, cst.Call):
            if self._is_factory(value.func):
                flag = keyword_arg(value, "requires_grad")
                return flag is None or is_false(flag.value)
            method = method_name(value)
            if method is None or method == "requires_grad_" or self._is_module_function(value):
                return False
            # a method of a tensor nobody holds gives that tensor or a new one
            return method == "detach" or self.is_fresh(value.func.value) or (
                method in NEW_TENSOR_METHODS and self.is_grad_free(value.func.value)
            )
        return False

    def _is_factory(self, func: Expression) -> bool:
        """`torch.zeros`, `torch.FloatTensor`, or a name for them:
        `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`."""
        if self.model.is_qualified(func, TENSOR_FACTORIES):
            return True
        if isinstance(func, cst.IfExp):
            return self._is_factory(func.body) and self._is_factory(func.orelse)
        if not isinstance(func, cst.Name):
            return False
        bindings = self.model.bindings_of(func.value, func)
        return bool(bindings) and all(
            b.kind == "assign" and b.value is not None and not isinstance(b.value, cst.Name) and self._is_factory(b.value)
            for b in bindings
        )

    def is_grad_free(self, value: Expression) -> bool:
        """Provably carries no gradient (nor does anything inside it)."""
        if self.is_fresh(value) or is_number_literal(value) and not isinstance(value, cst.Name):
            return True
        if isinstance(value, cst.Call):
            method = method_name(value)
            if self.model.is_call_to(value, v.VARIABLE):
                flag = keyword_arg(value, "requires_grad")
                return flag is None or is_false(flag.value)
            return (
                method is not None and method != "requires_grad_" and not self._is_module_function(value)
                and self.is_grad_free(value.func.value)
            )  # fmt: skip
        if isinstance(value, cst.Subscript):
            return self.is_grad_free(value.value)
        if isinstance(value, cst.BinaryOperation):
            return self.is_grad_free(value.left) and self.is_grad_free(value.right)
        if isinstance(value, cst.IfExp):
            return self.is_grad_free(value.body) and self.is_grad_free(value.orelse)
        if isinstance(value, cst.Name):
            return self._name_grad_free(value)
        return False

    def _name_grad_free(self, name: cst.Name) -> bool:
        bindings = self.model.bindings_of(name.value, name)
        if not bindings or name.value in self._global_names:
            return False
        key = (id(bindings[0].scope), name.value)
        if key not in self._grad_free:
            self._grad_free[key] = True  # a binding that reads the name itself adds nothing new
            self._grad_free[key] = all(self._binding_grad_free(b) for b in bindings)
        return self._grad_free[key]

    def _binding_grad_free(self, binding: Binding) -> bool:
        if binding.kind == "for" and isinstance(binding.statement, cst.For):
            return self._iterates_a_loader(binding.statement)
        if binding.kind == "param":
            arguments = self._arguments(binding)
            return bool(arguments) and all(self.is_grad_free(argument) for argument in arguments)
        if binding.kind != "assign":
            return False
        value = assigned(binding)
        if value is None and isinstance(binding.statement, cst.Assign):
            value = binding.statement.value  # `real, _ = batch`: the parts of a value without gradients
        return value is not None and self.is_grad_free(value)

    def _iterates_a_loader(self, loop: cst.For) -> bool:
        first = loop.body.body[0] if loop.body.body else None
        loops = self.model.loops_around(first) if first is not None else []
        return bool(loops) and loops[0].node is loop and loops[0].loader is not None
