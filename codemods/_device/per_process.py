"""GPU indices that each process computes (`.cuda(rank)` in an `mp.spawn`
worker, `torch.device("cuda", i)`, `f"cuda:{i}"`), and placements in a file
that selects its GPU itself (`torch.cuda.set_device(rank)`), where plain
"cuda" means that GPU: they become the runtime's `device_at(index)`, the same
GPU wherever CUDA is available and the runtime's device elsewhere. Their
meaning per process is kept; they are never collapsed onto one device.

And `DistributedDataParallel(model, device_ids=[rank])`: a model on the CPU
refuses GPU `device_ids`, so they follow the model's own device."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import code_of, is_docstring, keyword_arg, walk
from .literals import (
    COMPUTED_ADVICE, DEVICE_AT, TORCH_DEVICE, formatted_index, last_name, positional, string_verdict,
)

DDP = {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
DDP_DEVICE_IDS = "accelmigrate.runtime.distributed.ddp_device_ids"


class PerProcessPlans:
    """Mixed into the codemod."""

    def _device_at(self, site: cst.CSTNode, index: Optional[cst.BaseExpression]) -> str:
        """The code of `device_at(index)` for `site`; "" when that name means
        something else there, or in a library (its callers choose devices)."""
        if not self._chooses_device(site) or not self._runtime_name_free(site, "device_at", DEVICE_AT):
            return ""
        self._device_at_sites[site] = code_of(index) if index is not None else ""
        return f"device_at({self._device_at_sites[site]})"

    def _computed_index(self, node: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        """The index of `torch.device("cuda", i)`, `torch.device(f"cuda:{i}")`
        or `f"cuda:{i}"` (and its `.format` / `%` spellings)."""
        if isinstance(node, cst.Call) and self.is_call_to(node, TORCH_DEVICE):
            args = positional(node)
            kind = args[0] if args else keyword_arg(node, "type")
            index = args[1] if len(args) > 1 else keyword_arg(node, "index")
            if index is not None:
                return index.value
            return formatted_index(kind.value) if kind is not None else None
        return formatted_index(node)

    def _plan_computed(self, node: cst.BaseExpression, subject: str) -> None:
        """`node` names a GPU computed at run time: -> `device_at(index)`."""
        index = self._computed_index(node)
        placement = self._device_at(node, index) if index is not None else ""
        if not placement:
            self.report(node, "AM313", f"{subject}: {COMPUTED_ADVICE}")
            return
        if self.fix(node, "AM313", f"{subject} -> `{placement}`: the same GPU per process with CUDA, the runtime's device without"):
            expression = self._use_placement(node, placement)
            self._edits[node] = lambda updated: expression.with_changes(lpar=updated.lpar, rpar=updated.rpar)

    def _plan_computed_definition(self, definition) -> None:
        if definition.device.is_string:
            verdict = string_verdict(self._string_uses(definition), last_name(definition.target))
            if verdict != "rewrite":
                if verdict == "report":
                    self.report(definition.value, "AM313", COMPUTED_ADVICE)
                return
        self._plan_computed(definition.value, "device of a GPU index computed at run time")

    # One binding per function.

    def _plan_device_bindings(self) -> None:
        """A function whose placements all name the same GPU, its own parameter
        (`def worker(rank, ...)`) or the current one, binds `device =
        device_at(rank)` once at its top and places with `device`, as code
        written by hand would (and as the `amp` codemod needs)."""
        by_function: dict = {}
        for site in self._placed_at:
            function = next((a for a in self.ancestors(site) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)
            by_function.setdefault(function, set()).add(self._device_at_sites[site])
        for function, indices in by_function.items():
            index = next(iter(indices))
            if isinstance(function, cst.FunctionDef) and len(indices) == 1 and self._may_bind_device(function, index):
                self._device_bound_in[function] = index

    def _may_bind_device(self, function: cst.FunctionDef, index: str) -> bool:
        """No variable `device` in `function`, and `index` (if any) is its parameter, never rebound."""
        if any(isinstance(node, cst.Name) and node.value == "device" and not self._names_a_field(node) for node in walk(function)):
            return False
        if not index:
            return True
        scope = self.script.index.scope_by_node.get(function)
        bindings = scope.bindings.get(index, ()) if scope is not None else ()
        return bool(bindings) and all(b.kind == "param" for b in bindings)

    def _names_a_field(self, name: cst.Name) -> bool:
        """`x.device` or `f(device=...)`: the word, not the variable."""
        parent = self.parent(name)
        return (isinstance(parent, cst.Attribute) and parent.attr is name) or (isinstance(parent, cst.Arg) and parent.keyword is name)

    def _bind_device(self, function: cst.FunctionDef, index: str) -> cst.FunctionDef:
        """`device = device_at(index)` at the top of `function`, and `device` at its placements."""
        body = function.body.visit(_DeviceAtCalls(index))
        statements = list(body.body)
        at = 1 if statements and is_docstring(statements[0]) else 0
        line = cst.parse_statement(f"device = device_at({index})\n")
        return function.with_changes(body=body.with_changes(body=[*statements[:at], line, *statements[at:]]))

    # DistributedDataParallel's device_ids.

    def _plan_ddp_device_ids(self, call: cst.Call) -> None:
        """`DistributedDataParallel(model, device_ids=[i], output_device=i)` ->
        `DistributedDataParallel(model, device_ids=ddp_device_ids(model))`: the
        model's GPU where it is on one ([i] once it is placed on GPU i), None
        on the CPU. `output_device` defaults to that GPU."""
        if not self.is_call_to(call, DDP):
            return
        ids = keyword_arg(call, "device_ids")
        args = positional(call)
        if ids is None or not isinstance(ids.value, cst.List) or len(ids.value.elements) != 1 or len(args) != 1:
            return
        model = args[0].value
        output = keyword_arg(call, "output_device")
        only = ids.value.elements[0].value
        if not isinstance(model, (cst.Name, cst.Attribute)) or (output is not None and not output.value.deep_equals(only)):
            self.report(ids.value, "AM316", DDP_IDS_ADVICE)
            return
        if not self._runtime_name_free(call, "ddp_device_ids", DDP_DEVICE_IDS):
            self.report(ids.value, "AM316", DDP_IDS_ADVICE + " (`ddp_device_ids` means something else here)")
            return
        if self.fix(ids.value, "AM316", f"`device_ids=[{code_of(only)}]` -> `device_ids=ddp_device_ids({code_of(model)})`: the model's GPU, None on the CPU"):
            self.add_import("accelmigrate.runtime.distributed", "ddp_device_ids")
            replacement = cst.parse_expression(f"ddp_device_ids({code_of(model)})")
            self._edits[ids.value] = lambda updated: replacement
            if output is not None:
                self._edits[call] = lambda updated: updated.with_changes(args=without_keyword(updated.args, "output_device"))


DDP_IDS_ADVICE = (
    "DistributedDataParallel with GPU `device_ids`, which a model on the CPU refuses: pass "
    "`device_ids=ddp_device_ids(model)` (accelmigrate.runtime.distributed) and drop `output_device` by hand"
)


class _DeviceAtCalls(cst.CSTTransformer):
    """`device_at(<index>)`, which the codemod wrote, -> `device`."""

    def __init__(self, index: str) -> None:
        super().__init__()
        self.index = index

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # a nested function may name another index by the same name

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = updated_node.func
        if isinstance(func, cst.Name) and func.value == "device_at" and code_of_args(updated_node) == self.index:
            return cst.Name("device", lpar=updated_node.lpar, rpar=updated_node.rpar)
        return updated_node


def code_of_args(call: cst.Call) -> str:
    return ", ".join(code_of(arg.value) for arg in call.args)


def without_keyword(args, name: str) -> list:
    """`args` without the keyword argument `name`; a new last argument takes
    the removed one's comma (none, or a trailing one) and the space after it."""
    kept = [arg for arg in args if arg.keyword is None or arg.keyword.value != name]
    if kept and kept[-1] is not args[-1]:
        kept[-1] = kept[-1].with_changes(comma=args[-1].comma, whitespace_after_arg=args[-1].whitespace_after_arg)
    return kept
