"""Legacy CUDA tensor types used as values: `x.type(torch.cuda.FloatTensor)`
and the idiom of older scripts (GAN collections use it everywhere)

    Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
    valid = Tensor(n, 1).fill_(1.0)
    real = imgs.type(Tensor)

where `cuda` is CUDA's availability. The choice becomes the runtime's device's
(`tensor_type(torch.float32, device)`: the same CPU or CUDA type there) and
`x.type(T)` becomes `x.to(device, torch.float32)`, which converts and moves
alike on every device. Only when every read of the name is one of those two
uses; otherwise the finding says the manual step. (Calls of a legacy CUDA
constructor are `_plan_legacy`'s.)"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .literals import LEGACY_DTYPES, LEGACY_MODULE, LEGACY_TYPES, LEGACY_VALUE_ADVICE, TENSOR_TYPE, method_name

CPU_TYPES = {f"torch.{kind}Tensor": kind for kind in LEGACY_DTYPES}
CUDA_TYPES = {f"torch.cuda.{kind}Tensor": kind for kind in LEGACY_DTYPES}


class LegacyTypePlans:
    """Mixed into the codemod, after the calls are planned."""

    def _plan_legacy_values(self) -> None:
        handled: set = set()
        for target, statement in self.facts.assignments:
            choice = statement.value
            kind = self._legacy_choice(choice)
            if kind is not None and isinstance(target, cst.Name):
                handled.update(self._plan_legacy_choice(target, statement, kind))
        for node in self.facts.legacy_references:
            if node in handled or not self.is_qualified(node, LEGACY_TYPES):
                continue
            call = self._type_call_of(node)
            placement = self._placement(call) if call is not None else ""
            if not placement:
                self.report(node, "AM308", LEGACY_VALUE_ADVICE)
            elif self.fix(call, "AM308", f"`.type(<legacy CUDA type>)` -> `.to({placement}, {self._dtype_code(self._cuda_kind(node))})`"):
                self._plan_type_call(call, placement, self._cuda_kind(node))

    def _legacy_choice(self, node: cst.BaseExpression) -> Optional[str]:
        """"Float" for `torch.cuda.FloatTensor if <CUDA available> else
        torch.FloatTensor` (or `torch.Tensor`), either way round."""
        if not isinstance(node, cst.IfExp):
            return None
        for cuda, cpu, cuda_first in ((node.body, node.orelse, True), (node.orelse, node.body, False)):
            kind = self._cuda_kind(cuda)
            if kind is None or not self._is_availability(node.test, cuda_first):
                continue
            cpu_names = self.qualified_names(cpu)
            if CPU_TYPES.get(next(iter(cpu_names & CPU_TYPES.keys()), "")) == kind or (
                kind == "Float" and "torch.Tensor" in cpu_names and not self._sets_default_dtype()
            ):
                return kind
        return None

    def _cuda_kind(self, node: cst.CSTNode) -> Optional[str]:
        if not isinstance(node, (cst.Name, cst.Attribute)):
            return None
        found = self.qualified_names(node) & CUDA_TYPES.keys()
        return CUDA_TYPES[next(iter(found))] if found else None

    def _sets_default_dtype(self) -> bool:
        """`torch.Tensor(...)` follows the default dtype, which the file may change."""
        return any(
            self.is_call_to(call, {"torch.set_default_dtype", "torch.set_default_tensor_type"}) for call in self.facts.calls
        )

    def _plan_legacy_choice(self, target: cst.Name, statement, kind: str) -> list:
        """Plan the binding and its `.type(T)` reads; the references that it
        covers (none when it is left alone with a finding)."""
        choice = statement.value
        scope = self.script.scope_of(statement)
        cuda_branch = choice.body if self._cuda_kind(choice.body) else choice.orelse
        bindings = scope.bindings.get(target.value, ())
        reads = self.facts.uses.reads(target.value, scope)
        type_calls = [self._type_call_of(read) for read in reads]
        constructed = [read for read in reads if isinstance(self.parent(read), cst.Call) and self.parent(read).func is read]
        placement = self._placement(choice)
        placements = [self._placement(call) for call in type_calls if call is not None]
        if (
            len(bindings) != 1
            or len(constructed) + len(placements) != len(reads)
            or not placement
            or not all(placements)
        ):
            self.report(cuda_branch, "AM308", LEGACY_VALUE_ADVICE)
            return [cuda_branch]
        if not self._runtime_name_free(choice, "tensor_type", TENSOR_TYPE):
            self.report(cuda_branch, "AM308", LEGACY_VALUE_ADVICE + " (`tensor_type` means something else here)")
            return [cuda_branch]
        dtype = self._dtype_code(kind)
        if not self.fix(choice, "AM308", f"legacy tensor type chosen by CUDA's presence -> `tensor_type({dtype}, {placement})`: the same type on the CPU and CUDA"):
            return [cuda_branch]
        self.add_import(LEGACY_MODULE, "tensor_type")
        expression = self._use_placement(choice, placement)
        self._edits[choice] = lambda updated: cst.Call(
            func=cst.Name("tensor_type"), args=[cst.Arg(cst.parse_expression(dtype), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), cst.Arg(expression)]
        )
        for call, site_placement in zip([c for c in type_calls if c is not None], placements):
            if self.fix(call, "AM308", f"`.type({target.value})` -> `.to({site_placement}, {dtype})`"):
                self._plan_type_call(call, site_placement, kind)
        return [cuda_branch]

    def _type_call_of(self, node: cst.CSTNode) -> Optional[cst.Call]:
        """`x.type(node)` with `node` its only argument."""
        arg = self.parent(node)
        call = self.parent(arg) if isinstance(arg, cst.Arg) else None
        if isinstance(call, cst.Call) and method_name(call) == "type" and len(call.args) == 1 and arg.keyword is None and not arg.star:
            return call
        return None

    def _plan_type_call(self, call: cst.Call, placement: str, kind: str) -> None:
        """`x.type(T)` -> `x.to(device, torch.<dtype>)`."""
        expression = self._use_placement(call, placement)
        dtype = cst.parse_expression(self._dtype_code(kind))
        self._edits[call] = lambda updated: updated.with_changes(
            func=updated.func.with_changes(attr=cst.Name("to")),
            args=[cst.Arg(expression, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), cst.Arg(dtype)],
        )

    def _dtype_code(self, kind: str) -> str:
        return f"{self._torch_name()}.{LEGACY_DTYPES[kind]}"
