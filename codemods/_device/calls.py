"""The plans for each call that hard-codes CUDA: `.cuda()`, `torch.device("cuda")`,
legacy CUDA tensor types, "cuda" strings passed to torch, `torch.load`."""

from __future__ import annotations

from typing import Iterable, Optional

import libcst as cst

from .._base import append_keyword_args, code_of, has_star_args, keyword_arg
from .literals import (
    COMPUTED_ADVICE, COMPUTED_GPU, CUDA, DEFAULT_ADVICE, DEVICE_METHODS, EXPLICIT_GPU, LEGACY_TYPES, NEEDS_GPU,
    NEEDS_GPU_ADVICE, PASSED_IN_ADVICE, RUNTIME, SET_DEFAULT_DEVICE, SOME_DEVICE, STRING_DEVICE_ADVICE,
    STRING_DEVICE_APIS, TORCH_DEVICE, TORCH_LOAD, cuda_literal, integer_value, method_name, positional, string_verdict,
)
from .syntax import cuda_arguments, legacy_to_cpu, mentions_cuda, to_call


class CallPlans:
    """Mixed into the codemod: plans `self._edits` for the calls of the file."""

    def _move_kind(self, call: cst.Call) -> Optional[str]:
        """How this call hard-codes CUDA, if it does in a way we rewrite."""
        if method_name(call) == "cuda" and not self.is_qualified(call.func, {"torch.cuda"}):
            return "cuda"
        if self.is_call_to(call, TORCH_DEVICE) and self._torch_device_value(call).kind == CUDA:
            return "torch.device" if call not in self._definition_nodes else None
        if self.is_call_to(call, LEGACY_TYPES):
            return "legacy"
        return None

    def _needs_device(self, call: cst.Call) -> bool:
        """Could this call be rewritten with a device name (ignoring suppressions)?"""
        return (
            self._move_kind(call) is not None
            or self._is_load_without_map(call)
            or any(True for _ in self._device_string_arguments(call))
        )

    def _plan_calls(self) -> None:
        for call in reversed(self.facts.calls):  # inner calls first: `x.cuda().cuda()`
            if self._inside_map_location_lambda(call) or self._expects_error(call):
                continue
            self._plan_backend(call)
            if self._in_parameter_default(call):
                self._report_in_default(call)
                continue
            kind = self._move_kind(call)
            if self._placed_by_its_cuda_call(call):
                continue  # `.cuda(torch.device("cuda", i))`: the `.cuda` call places it (`device_at(i)`)
            if kind == "cuda":
                self._plan_cuda_method(call)
            elif kind == "torch.device" and self._torch_device_value(call).kind not in (EXPLICIT_GPU, COMPUTED_GPU):
                self._plan_torch_device(call)
            elif kind == "legacy":
                self._plan_legacy(call)
            else:
                self._plan_string_arguments(call)
            if self.is_call_to(call, TORCH_LOAD):
                self._plan_load(call)
            if self.is_call_to(call, NEEDS_GPU) and not self._under_cuda_check(call):
                self.report(call, "AM312", NEEDS_GPU_ADVICE)
            if self.is_call_to(call, TORCH_DEVICE) and call not in self._definition_nodes:
                kind = self._torch_device_value(call).kind
                if kind == EXPLICIT_GPU:
                    self.report(call, "AM310", self._explicit_reason())
                elif kind == COMPUTED_GPU:
                    self._plan_computed(call, f"`{code_of(call)}`")

    def _placed_by_its_cuda_call(self, call: cst.Call) -> bool:
        """`call` is the argument of a `.cuda(...)` call: the device it names is that call's to place."""
        arg = self.parent(call)
        outer = self.parent(arg) if isinstance(arg, cst.Arg) else None
        return isinstance(outer, cst.Call) and self._move_kind(outer) == "cuda" and self.is_call_to(call, TORCH_DEVICE)

    def _report_in_default(self, call: cst.Call) -> None:
        """A placement in a parameter default runs where the function is
        defined, at import: it is never rewritten to the run-time device."""
        if self._move_kind(call) is not None or any(True for _ in self._device_string_arguments(call)):
            self.report(call, "AM302", DEFAULT_ADVICE)

    def _plan_cuda_method(self, call: cst.Call) -> None:
        """`x.cuda(...)` -> `x.to(device, ...)`."""
        if has_star_args(call):
            self.report(call, "AM311", "`.cuda(*args)`: the arguments cannot be read; write `.to(device)` by hand")
            return
        receiver = call.func.value
        if isinstance(receiver, (cst.Name, cst.Attribute)) and any(
            name.startswith("torch.") for name in self.qualified_names(receiver)
        ):
            self.report(call, "AM311", "`.cuda` of a torch class (`torch.Tensor.cuda(x)`): write `x.to(device)` by hand")
            return
        kept, index = cuda_arguments(call)
        index_kind = RUNTIME if index is None else self._index_kind(index, call)
        if index_kind == EXPLICIT_GPU:
            self.report(call, "AM310", f"`.cuda({code_of(index)})`: {self._explicit_reason()}")
            return
        if index_kind == COMPUTED_GPU:
            written = code_of(index)
            index = self._computed_index(index) or index  # `.cuda(torch.device("cuda", i))`: GPU i, as `device_at(i)` says once
            passed_in = self._is_parameter(index, defaulting_to_none=True) or (
                self._is_parameter(index) and "dev" in code_of(index).lower()
            )
            placement = "" if passed_in else self._device_at(call, index)
            if not placement:
                advice = PASSED_IN_ADVICE if passed_in else COMPUTED_ADVICE
                self.report(call, "AM313", f"`.cuda({written})`: {advice}")
            elif self.fix(call, "AM313", f"`.cuda({written})` -> `.to({placement})`: the same GPU per process with CUDA, the runtime's device without"):
                expression = self._use_placement(call, placement)
                self._edits[call] = lambda updated: to_call(updated, expression)
            return
        placement = self._placement(call)
        if not placement:
            taken = self._binding_name or "device"
            self._report_unplaced(call, "`.cuda()`", f"no device name can be used here (`{taken}` means something else in this scope); write `.to(<device>)` by hand")
            return
        if self._is_redundant_move(receiver, kept):
            if self.fix(call, "AM305", "removed a second device move: the value is already on the device"):
                self._edits[call] = lambda updated: updated.func.value.with_changes(
                    lpar=updated.lpar or updated.func.value.lpar, rpar=updated.rpar or updated.func.value.rpar
                )
            return
        if isinstance(receiver, cst.Call) and method_name(receiver) == "cpu" and not receiver.args:
            self.report(call, "AM306", "`.cpu().cuda()` copies to the host and back: drop `.cpu()` if no copy is needed (or write `.clone()`)")
        if self.fix(call, "AM301", f"`.cuda()` -> `.to({placement})`"):
            expression = self._use_placement(call, placement)
            self._edits[call] = lambda updated: to_call(updated, expression)

    def _is_redundant_move(self, receiver: cst.BaseExpression, kept: list[cst.Arg]) -> bool:
        """`x.cuda().cuda()`: the outer move of a value that the inner one just
        moved (and rewrites) does nothing."""
        if any(arg.keyword is not None and arg.keyword.value == "memory_format" for arg in kept):
            return False
        return isinstance(receiver, cst.Call) and self._move_kind(receiver) == "cuda" and receiver in self._edits

    def _plan_torch_device(self, call: cst.Call) -> None:
        """`torch.device("cuda")` (not a definition) -> device."""
        placement = self._placement(call)
        if not placement:
            self._report_unplaced(call, "`torch.device(\"cuda\")`", "no device name can be used here; replace it by hand")
            return
        if self.fix(call, "AM302", f"`{code_of(call)}` -> `{placement}`"):
            expression = self._use_placement(call, placement)
            self._edits[call] = lambda updated: expression.with_changes(lpar=updated.lpar, rpar=updated.rpar)

    def _plan_legacy(self, call: cst.Call) -> None:
        """`torch.cuda.FloatTensor(...)` -> `torch.FloatTensor(...).to(device)`."""
        func = call.func
        placement = self._placement(call)
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Attribute) and func.value.attr.value == "cuda") or not placement:
            manual = "write `torch.FloatTensor(...).to(device)` (or `torch.tensor(..., device=device)`) by hand"
            if self._gpu_choice is not None:
                self.report(call, "AM313", f"legacy CUDA tensor constructor: {self._gpu_choice_reason()}")
            else:
                self.report(call, "AM308", f"legacy CUDA tensor constructor: {manual}")
            return
        if self.fix(call, "AM308", f"legacy CUDA tensor constructor -> CPU constructor + `.to({placement})`"):
            expression = self._use_placement(call, placement)
            self._edits[call] = lambda updated: legacy_to_cpu(updated, expression)

    def _plan_string_arguments(self, call: cst.Call) -> None:
        """"cuda" passed where torch expects a device: `.to("cuda")`,
        `torch.zeros(..., device="cuda")`, `torch.set_default_device("cuda")`."""
        default = keyword_arg(call, "default")
        flag_default = method_name(call) == "add_argument" and default is not None and cuda_literal(default.value) is not None
        arguments = list(self._device_string_arguments(call))
        if not (flag_default or arguments):
            return  # most calls: nothing to look up
        if any(name.startswith(STRING_DEVICE_APIS) for name in self.qualified_names(call.func)):
            return  # torch.autocast("cuda"), GradScaler(device="cuda"): the amp codemod's concern
        if flag_default:
            self.report(default.value, "AM302", "command-line device defaulting to \"cuda\": make the default None and use `torch.device(args.device) if args.device else get_device()`")
            return
        for arg in arguments:
            if self._is_explicit(arg.value):
                self.report(arg.value, "AM310", self._explicit_reason())
                continue
            if self._string_gpu(arg.value) == COMPUTED_GPU:
                if self._takes_torch_device(call, arg):
                    self._plan_computed(arg.value, f"`{code_of(arg.value)}`")
                else:
                    self.report(arg.value, "AM313", COMPUTED_ADVICE)
                continue
            if not self._takes_torch_device(call, arg):
                self.report(arg.value, "AM302", "\"cuda\" passed to a function that is not torch's: pass the runtime's device (get_device()) by hand if it takes a torch.device")
                continue
            placement = self._placement(arg.value)
            if not placement:
                self._report_unplaced(arg.value, "\"cuda\"", "no device name can be used here; replace it by hand")
                continue
            if self.fix(arg.value, "AM302", f"hard-coded `{code_of(arg.value)}` -> `{placement}`"):
                expression = self._use_placement(arg.value, placement)
                self._edits[arg.value] = lambda updated, e=expression: e

    def _device_string_arguments(self, call: cst.Call) -> Iterable[cst.Arg]:
        """Arguments that name a CUDA device as a string and that we look at."""
        literals = [
            (position, arg) for position, arg in enumerate(call.args)
            if cuda_literal(arg.value) is not None or integer_value(arg.value) is not None
        ]
        if not literals or self.is_call_to(call, TORCH_DEVICE) or call in self._definition_nodes:
            return  # torch.device(...) is handled whole
        for position, arg in literals:
            if cuda_literal(arg.value) is None and not self._is_torch_ordinal(call, arg):
                continue
            if arg.keyword is not None and arg.keyword.value in ("device", "map_location"):
                yield arg
            elif arg.keyword is None and position == 0 and (
                method_name(call) == "to" or self.is_call_to(call, SET_DEFAULT_DEVICE)
            ):
                yield arg

    def _is_torch_ordinal(self, call: cst.Call, arg: cst.Arg) -> bool:
        """A GPU ordinal given to torch as a device: `.to(0)`, `device=0`."""
        if integer_value(arg.value) is None:
            return False
        if arg.keyword is None:
            return method_name(call) == "to" or self.is_call_to(call, SET_DEFAULT_DEVICE)
        return arg.keyword.value == "device" and self._takes_torch_device(call, arg)

    def _takes_torch_device(self, call: cst.Call, arg: cst.Arg) -> bool:
        if arg.keyword is not None and arg.keyword.value == "map_location":
            return self.is_call_to(call, TORCH_LOAD)
        if method_name(call) in DEVICE_METHODS:
            return True  # a tensor's or a module's method
        return any(n.startswith("torch.") for n in self.qualified_names(call.func))

    # torch.load.

    def _is_load_without_map(self, call: cst.Call) -> bool:
        return (
            self.is_call_to(call, TORCH_LOAD)
            and not has_star_args(call)
            and len(positional(call)) < 2
            and keyword_arg(call, "map_location") is None
            and bool(call.args)
        )

    def _plan_load(self, call: cst.Call) -> None:
        lambda_arg = keyword_arg(call, "map_location")
        if lambda_arg is not None and self._moves_storage_to_gpu(lambda_arg.value):
            placement = self._placement(call)
            if placement and self.fix(lambda_arg.value, "AM304", f"map_location that moves every storage to the GPU -> `map_location={placement}`"):
                expression = self._use_placement(call, placement)
                self._edits[lambda_arg.value] = lambda updated: expression
            return
        if not self._is_load_without_map(call):
            return
        computes_on_cpu = self._chooses_device(call) and self._gpu_choice is None and not self._places_on_device()
        # A library's checkpoint without map_location loads where it was saved
        # (a CPU one on the CPU): mapping it to the GPU would be a change of meaning.
        placement = '"cpu"' if computes_on_cpu else self._placement(call, current_gpu_in_library=False)
        if not placement:
            self._report_unplaced(call, "torch.load without map_location", "add `map_location=<device>` by hand")
            return
        if placement == '"cpu"':
            message = 'torch.load without map_location -> `map_location="cpu"`: this file places nothing on a device, so it computes on the CPU'
        else:
            message = f"torch.load without map_location -> `map_location={placement}`: a checkpoint saved on a GPU loads where the script computes"
        if self.fix(call, "AM304", message):
            expression = self._use_placement(call, placement) if placement != '"cpu"' else cst.SimpleString('"cpu"')
            self._edits[call] = lambda updated: append_keyword_args(updated, [("map_location", expression)])

    def _places_on_device(self) -> bool:
        """Does this file choose a device anywhere (so loads should follow it)?"""
        return (
            bool(self._fallback_sites)
            or self._uses_runtime
            or any(d.usable and d.device.kind in (RUNTIME, SOME_DEVICE, CUDA, "choice") for d in self._definitions)
            or any(self._move_kind(c) is not None or any(True for _ in self._device_string_arguments(c)) for c in self.facts.calls)
        )

    def _moves_storage_to_gpu(self, node: cst.CSTNode) -> bool:
        """`lambda storage, loc: storage.cuda()`."""
        if not isinstance(node, cst.Lambda) or not node.params.params:
            return False
        body = node.body
        first = node.params.params[0].name.value
        return (
            isinstance(body, cst.Call)
            and method_name(body) == "cuda"
            and isinstance(body.func.value, cst.Name)
            and body.func.value.value == first
            and all(a.keyword is None and self._index_kind(a.value) == RUNTIME for a in body.args)
        )

    def _inside_map_location_lambda(self, call: cst.Call) -> bool:
        for ancestor in self.ancestors(call):
            if isinstance(ancestor, cst.Lambda):
                arg = self.parent(ancestor)
                return isinstance(arg, cst.Arg) and arg.keyword is not None and arg.keyword.value == "map_location" and self._moves_storage_to_gpu(ancestor)
        return False

    def _under_cuda_check(self, node: cst.CSTNode) -> bool:
        """Inside an `if` whose test mentions CUDA (`torch.cuda.is_available()`,
        `device.type == "cuda"`, `args.cuda`...)."""
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.If, cst.IfExp)) and child is not ancestor.test and mentions_cuda(ancestor.test):
                return True
            child = ancestor
        return False

    # Parameter defaults.

    def _plan_parameter_defaults(self) -> None:
        """`def train(model, device="cuda")`: a default is evaluated where the
        function is defined, at import, so it is never rewritten to the
        run-time device; reported when the function passes it on as a device."""
        for param in self.facts.parameters:
            if cuda_literal(param.default) is None:
                continue
            if self._is_explicit(param.default):
                self.report(param.default, "AM310", self._explicit_reason())
                continue
            verdict = string_verdict(self._parameter_uses(param), param.name.value)
            if verdict == "report":
                self.report(param.default, "AM302", STRING_DEVICE_ADVICE)
            elif verdict == "rewrite":
                self.report(param.default, "AM302", DEFAULT_ADVICE)
