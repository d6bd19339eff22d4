"""What a device expression, a GPU index or a device definition means: read
from the literals and from the script model's bindings."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import libcst as cst

from .._base import code_of, has_star_args, is_name, keyword_arg
from .literals import (
    ANY_GPU, COMPUTED_GPU, CPU, CUDA, CUDA_DEVICE_CONTEXT, ENVIRON, ENVIRON_GETTERS, EXPLICIT_GPU,
    GET_DEVICE, IS_AVAILABLE, LIBRARY_DEFINITION_ADVICE, LOCAL_RANK_FLAGS, LOCAL_RANK_FUNCTIONS, OTHER_GPU, RUNTIME,
    SELF_TEST, SELF_TEST_DEFINITION_ADVICE, SET_DEVICE, SOME_DEVICE, STRING_DEVICE_ADVICE, TORCH_DEVICE, VARIABLE_GPU,
    ZERO_GPU, Definition, DeviceValue, cuda_literal, formatted_index, gpu_index, integer_value, is_cpu_literal,
    last_name, method_name, positional, string_value, string_verdict,
)


class DeviceValues:
    """Mixed into the codemod: reads `self.script` and `self.facts`."""

    # Explicit GPUs.

    def _names_other_gpu(self, call: cst.Call) -> bool:
        """`.cuda(1)`, `torch.device("cuda", 1)`, `set_device(1)`, `"cuda:1"`."""
        if any(cuda_literal(arg.value) == OTHER_GPU for arg in call.args):
            return True
        indexed = method_name(call) in ("cuda", "to") or self.is_call_to(call, TORCH_DEVICE | SET_DEVICE)
        return indexed and any(integer_value(arg.value) not in (None, 0) for arg in call.args)

    def _is_explicit(self, node: cst.CSTNode) -> bool:
        """Does this GPU index or device string name a GPU to leave alone: one
        other than 0, or GPU 0 itself in a file that spreads work over several?"""
        kind = gpu_index(node)
        return kind == OTHER_GPU or (kind == ZERO_GPU and self._several_gpus)

    def _explicit_reason(self) -> str:
        if self._several_gpus:
            return "explicit GPU in a file that places work on several GPUs (model parallelism): left alone"
        return "explicit GPU other than 0: left alone (a deliberate choice?)"

    # Computed GPU indices: only the launcher's local rank is the runtime's GPU.

    def _index_kind(self, index: cst.BaseExpression, site: Optional[cst.CSTNode] = None) -> str:
        """What a GPU index or device string names: RUNTIME (the one GPU, or this
        process's local rank: get_device() serves it), EXPLICIT_GPU (AM310),
        VARIABLE_GPU (a device variable in reach at `site`, kept as it is) or
        COMPUTED_GPU (anything else known only at run time: left alone)."""
        literal = gpu_index(self._constant_of(index))
        if literal == COMPUTED_GPU:
            literal = self._string_gpu(index)
        if literal is not None and literal != COMPUTED_GPU:
            return EXPLICIT_GPU if self._is_explicit(self._constant_of(index)) else RUNTIME
        if literal is None and self._is_local_rank(index):
            return RUNTIME
        if site is not None and literal is None and self._is_device_variable(index, site):
            return VARIABLE_GPU
        return COMPUTED_GPU

    def _assigned_values(self, name: cst.Name) -> Optional[list]:
        """The values of every binding a use of `name` may read, when all of them
        are plain `name = value` assignments; None otherwise."""
        bindings = self.script.bindings_of(name.value, name)
        statements = [self.facts.assignment_of.get(b.node) for b in bindings]
        if not statements or None in statements:
            return None
        return [statement.value for statement in statements]

    def _constant_of(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """The integer a name is always bound to (`LOCAL_RANK = 0`), else `node`."""
        values = self._assigned_values(node) if isinstance(node, cst.Name) else None
        if not values or any(integer_value(v) is None for v in values):
            return node
        return values[0] if all(integer_value(v) == integer_value(values[0]) for v in values) else node

    def _string_gpu(self, node: cst.CSTNode) -> Optional[str]:
        """`cuda_literal`, with `f"cuda:{local_rank}"` read as ANY_GPU."""
        kind = cuda_literal(node)
        if kind == COMPUTED_GPU and self._is_local_rank(formatted_index(node)):
            return ANY_GPU
        return kind

    def _is_local_rank(self, node: Optional[cst.BaseExpression], depth: int = 0) -> bool:
        """Is `node` the local rank that the launcher gave this process
        (`int(os.environ["LOCAL_RANK"])`, a name or `args.local_rank` bound only
        to it)? get_device() picks that GPU too."""
        if node is None or depth > 8:
            return False
        if isinstance(node, cst.Call):
            if self.is_call_to(node, LOCAL_RANK_FUNCTIONS):
                return True
            only = node.args[0] if len(node.args) == 1 else None
            return (
                self.is_call_to(node, {"builtins.int"})
                and only is not None
                and only.keyword is None
                and not only.star
                and self._reads_local_rank_variable(only.value)
            )
        if isinstance(node, cst.Name):
            values = self._assigned_values(node)
            return bool(values) and all(self._is_local_rank(v, depth + 1) for v in values)
        if isinstance(node, cst.Attribute) and node.attr.value == "local_rank":
            return self._local_rank_flag and all(
                self._is_local_rank(statement.value, depth + 1)
                for target, statement in self.facts.assignments
                if isinstance(target, cst.Attribute) and target.attr.value == "local_rank"
            )
        return False

    def _reads_local_rank_variable(self, node: cst.BaseExpression) -> bool:
        """`os.environ["LOCAL_RANK"]`, `os.environ.get("LOCAL_RANK", ...)`, `os.getenv("LOCAL_RANK")`."""
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            key = node.slice[0].slice.value
            return self.is_qualified(node.value, ENVIRON) and string_value(key) == "LOCAL_RANK"
        if isinstance(node, cst.Call) and self.is_call_to(node, ENVIRON_GETTERS) and node.args:
            return node.args[0].keyword is None and string_value(node.args[0].value) == "LOCAL_RANK"
        return False

    def _declares_local_rank_flag(self, call: cst.Call) -> bool:
        """`parser.add_argument("--local_rank", ...)`: the flag by which
        torch.distributed.launch gives each process its local rank."""
        return method_name(call) == "add_argument" and any(
            string_value(arg.value) in LOCAL_RANK_FLAGS for arg in positional(call)
        )

    def _is_device_variable(self, node: cst.BaseExpression, site: cst.CSTNode) -> bool:
        """Is `node` the device variable that `site` would use anyway, bound
        only by device definitions (not a parameter, which may hold None or an
        index)?"""
        if not isinstance(node, (cst.Name, cst.Attribute)) or self._existing_device(site) != code_of(node):
            return False
        if isinstance(node, cst.Attribute):
            return True  # `self.device` set in `__init__`
        return not self._is_parameter(node)

    def _is_parameter(self, node: cst.BaseExpression, defaulting_to_none: bool = False) -> bool:
        """Is `node` a name bound by a parameter (one whose default is None)?"""
        if not isinstance(node, cst.Name):
            return False
        params = [b.node for b in self.script.bindings_of(node.value, node) if b.kind == "param"]
        if defaulting_to_none:
            return any(isinstance(p.default, cst.Name) and p.default.value == "None" for p in params)
        return bool(params)

    # Files that choose their GPU themselves.

    def _file_chooses_its_gpu(self, calls: Sequence[cst.Call]) -> Optional[cst.Call]:
        """The first `torch.cuda.set_device(i)` or `torch.cuda.device(i)` by which
        the file makes another GPU than the runtime's current: then plain
        `.cuda()` and "cuda" mean that GPU, and no placement may be collapsed
        onto the runtime's device."""
        for call in calls:
            if not self.is_call_to(call, SET_DEVICE | CUDA_DEVICE_CONTEXT) or not call.args or self._expects_error(call):
                continue
            index = call.args[0].value
            if self._index_kind(index) in (EXPLICIT_GPU, COMPUTED_GPU) and not self._is_device_variable(index, call):
                return call
        return None

    def _gpu_choice_reason(self) -> str:
        call = self._gpu_choice
        return (
            f"this file selects its GPU itself (`{code_of(call)}`, line {self.script.line(call)}), so plain CUDA "
            "placements mean that GPU: left alone; migrate the file by hand (under torchrun, `device = get_device()` "
            "is cuda:<LOCAL_RANK>)"
        )

    # Definitions of a device variable.

    def _read_definitions(self) -> list[Definition]:
        definitions = []
        for target, statement in self.facts.assignments:
            value = self._defined_device(statement.value)
            device = self._device_value(value)
            if device is not None:
                typed = not device.is_string
                usable = (typed or "dev" in last_name(target).lower()) and device.kind not in (EXPLICIT_GPU, COMPUTED_GPU)
                definitions.append(Definition(target, value, statement, device, usable=usable))
        self._definition_of = {d.statement: d for d in definitions}
        for definition in definitions:
            if definition.device.kind == CPU and definition.usable:
                definition.usable = False
                definition.cpu_branch = True  # usable only in an if/else, see _device_target_of
        return definitions

    def _defined_device(self, value: cst.BaseExpression) -> cst.BaseExpression:
        """The device that `value` defines: in `device or torch.device(...)`, the
        fallback (the passed-in device stays the caller's)."""
        if isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or):
            fallback = self._device_value(value.right)
            if fallback is not None and fallback.kind in (CUDA, "choice"):
                return value.right
        return value

    def _device_value(self, node: Optional[cst.BaseExpression]) -> Optional[DeviceValue]:
        """What `node` is as a device, or None when it is not one we know."""
        if node is None:
            return None
        index = self._string_gpu(node)
        if index == COMPUTED_GPU:
            return DeviceValue(COMPUTED_GPU, is_string=True)
        if index is not None:
            return DeviceValue(EXPLICIT_GPU if self._is_explicit(node) else CUDA, is_string=True)
        if is_cpu_literal(node):
            return DeviceValue(CPU, is_string=True)
        if isinstance(node, cst.Call) and self.is_call_to(node, GET_DEVICE):
            return DeviceValue(RUNTIME)
        if isinstance(node, cst.Call) and self.is_call_to(node, TORCH_DEVICE):
            return self._torch_device_value(node)
        if isinstance(node, cst.IfExp):
            return self._choice_value(node)
        return None

    def _torch_device_value(self, call: cst.Call) -> DeviceValue:
        args = positional(call)
        kind_arg = args[0] if args else keyword_arg(call, "type")
        index_arg = args[1] if len(args) > 1 else keyword_arg(call, "index")
        if kind_arg is None or has_star_args(call):
            return DeviceValue(SOME_DEVICE)
        if integer_value(kind_arg.value) is not None and index_arg is None:  # torch.device(0): an ordinal
            return DeviceValue(EXPLICIT_GPU if self._is_explicit(kind_arg.value) else CUDA)
        inner = self._device_value(kind_arg.value)
        if inner is None or not inner.is_string and inner.kind != "choice":
            return DeviceValue(SOME_DEVICE)
        if inner.kind == CUDA and index_arg is not None:
            index = self._index_kind(index_arg.value)
            if index == EXPLICIT_GPU:
                return DeviceValue(EXPLICIT_GPU)
            return DeviceValue(CUDA if index == RUNTIME else COMPUTED_GPU)
        return dataclasses.replace(inner, is_string=False)

    def _choice_value(self, node: cst.IfExp) -> Optional[DeviceValue]:
        body, orelse = self._device_value(node.body), self._device_value(node.orelse)
        if body is None or orelse is None:
            return None
        is_string = body.is_string and orelse.is_string
        if body.kind == CUDA and orelse.kind == CPU:
            return DeviceValue("choice", is_string, node.test, cuda_first=True)
        if body.kind == CPU and orelse.kind == CUDA:
            return DeviceValue("choice", is_string, node.test, cuda_first=False)
        kinds = {body.kind, orelse.kind}
        for left_alone in (EXPLICIT_GPU, COMPUTED_GPU):
            if left_alone in kinds:
                return DeviceValue(left_alone, is_string)
        return DeviceValue(SOME_DEVICE, is_string)

    # Rewriting definitions.

    def _plan_definitions(self) -> None:
        for definition in self._definitions:
            device = definition.device
            if self._expects_error(definition.value):
                continue
            if device.kind == EXPLICIT_GPU:
                definition.usable = False
                self.report(definition.value, "AM310", self._explicit_reason() + "; use get_device() if one GPU per process is meant")
            elif device.kind == COMPUTED_GPU:
                self._plan_computed_definition(definition)
            elif device.kind == CUDA or device.kind == "choice":
                self._plan_definition(definition)
            if device.is_string and definition.value in self._edits:
                self._compare_types(definition)

    def _plan_definition(self, definition: Definition) -> None:
        device = definition.device
        if device.is_string:
            verdict = string_verdict(self._string_uses(definition), last_name(definition.target))
            if verdict == "report":
                self.report(definition.value, "AM303", STRING_DEVICE_ADVICE)
            if verdict != "rewrite":
                return
        if self._gpu_choice is not None:
            self._plan_definition_after_gpu_choice(definition)
            return
        if not self._chooses_device(definition.value):
            placement = self._device_at(definition.value, None)  # "" unless a script of the run imports it
            if placement:
                self._plan_definition_followed(definition, placement)
                return
            advice = SELF_TEST_DEFINITION_ADVICE if self._role == SELF_TEST else LIBRARY_DEFINITION_ADVICE
            self.report(definition.value, "AM303", advice)
            return
        by_flag = device.kind == "choice" and not self._is_availability(device.test, device.cuda_first)
        if by_flag:
            message = "CUDA device definition -> get_device(), keeping the script's flag"
        else:
            message = "CUDA device definition -> get_device(): cuda:<local rank> when CUDA is there, else mps or cpu"
        if not self.fix(definition.value, "AM303", message):
            return
        self._uses_runtime = True
        if by_flag:
            self._edits[definition.value] = lambda updated: self._flag_choice(updated, device)
        else:
            self._edits[definition.value] = lambda updated: self._get_device_call()

    def _plan_definition_followed(self, definition: Definition, placement: str) -> None:
        """In a library that a script of the run imports (a config module's
        `device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")`),
        a CUDA device means the GPU that script made current: `device_at()`,
        which chooses and sets nothing, and is the script's device without
        CUDA too (where "cpu" would part from it on Apple silicon). A flag
        keeps choosing: `device_at() if flag else torch.device("cpu")`."""
        device = definition.device
        by_flag = device.kind == "choice" and not self._is_availability(device.test, device.cuda_first)
        kept = ", keeping the flag" if by_flag else ""
        message = f"CUDA device definition -> `{placement}`{kept}: the GPU that the importing script made current, its device without CUDA"
        if not self.fix(definition.value, "AM303", message):
            return
        expression = self._use_placement(definition.value, placement)
        if by_flag:
            self._edits[definition.value] = lambda updated: self._flag_choice(updated, device, expression)
        else:
            self._edits[definition.value] = lambda updated: expression.with_changes(lpar=updated.lpar, rpar=updated.rpar)

    def _plan_definition_after_gpu_choice(self, definition: Definition) -> None:
        """In a file that selects its GPU, "cuda" means that GPU: a choice on
        CUDA's availability already runs anywhere; plain "cuda" becomes
        `device_at()`, the current GPU with CUDA."""
        device = definition.device
        if device.kind == "choice" and self._is_availability(device.test, device.cuda_first):
            return
        placement = self._device_at(definition.value, None) if device.kind == CUDA else ""
        if not placement:
            self.report(definition.value, "AM313", f"CUDA device definition: {self._gpu_choice_reason()}")
        elif self.fix(definition.value, "AM303", f"CUDA device definition -> `{placement}`: the GPU this file selects, the runtime's device without CUDA"):
            expression = self._use_placement(definition.value, placement)
            self._edits[definition.value] = lambda updated: expression.with_changes(lpar=updated.lpar, rpar=updated.rpar)

    def _flag_choice(self, updated: cst.BaseExpression, device: DeviceValue, gpu: Optional[cst.BaseExpression] = None) -> cst.BaseExpression:
        """`torch.device("cuda" if flag else "cpu")` -> `get_device() if flag else torch.device("cpu")`
        (or `gpu` in place of `get_device()`)."""
        choice = updated.args[0].value if isinstance(updated, cst.Call) else updated
        cpu, gpu = self._cpu_device(), gpu if gpu is not None else self._get_device_call()
        if device.cuda_first:
            return choice.with_changes(body=gpu, orelse=cpu, lpar=updated.lpar, rpar=updated.rpar)
        return choice.with_changes(body=cpu, orelse=gpu, lpar=updated.lpar, rpar=updated.rpar)

    def _cpu_device(self) -> cst.BaseExpression:
        return cst.parse_expression(f'{self._torch_name()}.device("cpu")')

    def _torch_name(self) -> str:
        """The file's name for `import torch` (imported when there is none)."""
        if self.facts.torch_alias is None:
            self.add_import("torch")
            return "torch"
        return self.facts.torch_alias

    def _is_availability(self, test: Optional[cst.BaseExpression], positive: bool = True) -> bool:
        """Is `test` `torch.cuda.is_available()` (or `not` it when not `positive`),
        directly or through a name assigned only from it?"""
        if test is None:
            return False
        if not positive:
            return isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and self._is_availability(test.expression)
        if isinstance(test, cst.Call):
            return self.is_call_to(test, IS_AVAILABLE) and not test.args
        if isinstance(test, cst.Name):
            values = self._assigned_values(test)
            return bool(values) and all(self._is_availability(v) for v in values)
        if isinstance(test, cst.IfExp):  # `True if torch.cuda.is_available() else False`
            return is_name(test.body, "True") and is_name(test.orelse, "False") and self._is_availability(test.test)
        return False


__all__ = ["DeviceValues", "VARIABLE_GPU"]
