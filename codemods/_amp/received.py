"""Optimizers that a training function receives from code the codemod cannot
see: a parameter of `train_fn(model, loader, optimizer, device)` called from
another module of the project, `self.optimizer` of a trainer built by a
factory elsewhere.

No scaler can be bound next to such an optimizer, and a scaler made anew in
each call would start its loss scale over every epoch. The step takes the
optimizer's own: `scaler = scaler_for(optimizer, device, amp_dtype)` (the
runtime keeps one GradScaler per optimizer, made at its first call), bound
in the function before the loop, so that the loss scale carries over from
one call to the next as with a scaler bound next to the optimizer.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import code_of, is_docstring, walk
from .plan import SCALER_NAMES, Binding, Problem, Ref

RECEIVED = "received"  # the kind of an optimizer Ref the function receives


class Received:
    """Mixed into the codemod."""

    def optimizer_received(self, receiver: cst.BaseExpression, site: cst.CSTNode) -> Optional[Ref]:
        """A Ref of kind RECEIVED when the stepped `receiver` is a parameter
        of the function around `site` (or `self.<name>` in a method) that the
        function never rebinds: the same optimizer in every step of a call."""
        function = self.facts.function_at(site)
        if function is None:
            return None
        if isinstance(receiver, cst.Name):
            bindings = self.facts.bindings_of(receiver.value, site)
            if len(bindings) != 1 or bindings[0].kind != "param" or bindings[0].scope is not function.scope:
                return None
        elif isinstance(receiver, cst.Attribute) and isinstance(receiver.value, cst.Name):
            instance = self.facts.instance_parameter(function)
            if receiver.value.value != instance or self._assigned_in(function.node, code_of(receiver)):
                return None
        else:
            return None
        return Ref(RECEIVED, code_of(receiver), function.scope, [])

    @staticmethod
    def _assigned_in(function: cst.FunctionDef, spelled: str) -> bool:
        targets = [t for node in walk(function) if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)) for t in _targets(node)]
        return any(code_of(target) == spelled for target in targets)

    def scaler_received(self, group: list) -> Binding:
        """`scaler = scaler_for(optimizer, device, amp_dtype)` in the function
        that receives the optimizer: right after the dtype when the function
        binds it, else at its top."""
        spellings = {ref.name for plan in group for ref in plan.optimizers}
        site = group[0].site
        if len(spellings) != 1 or any(len(plan.optimizers) != 1 for plan in group):
            raise Problem(site, "AM414", "this function steps several optimizers it receives: bind one `scaler = grad_scaler(device, amp_dtype)` next to them in the caller and pass it in by hand")
        ref, device = group[0].optimizers[0], group[0].device
        if any(plan.device.key != device.key for plan in group):
            raise Problem(site, "AM413", "the steps of this function read different devices: bind its scaler by hand")
        dtype = self.dtype_binding(device)
        if self.facts.scope_of(dtype.after) is ref.home:
            after, before = dtype.after, dtype.before  # inserted right behind the dtype it reads
        else:
            body = list(ref.home.node.body.body)
            after, before = (body[1] if len(body) > 1 and is_docstring(body[0]) else body[0]), True
        name = self.free_name(ref, SCALER_NAMES, [site])
        value = f"{self.runtime_name('scaler_for')}({ref.name}, {self.device_text(device, after)}, {dtype.text(self.owner_at(after))})"
        return Binding("name", name, after, None, value, before=before)


def _targets(node: cst.CSTNode) -> list:
    if isinstance(node, cst.Assign):
        found = []
        for target in node.targets:
            value = target.target
            found += [e.value for e in value.elements] if isinstance(value, (cst.Tuple, cst.List)) else [value]
        return found
    return [node.target]
