"""Where a script binds its device.

`device = torch.device(...)` (or the runtime's `get_device()`), a device
string (`device = "cuda" if torch.cuda.is_available() else "cpu"`), the same
assigned to `self.device` or `args.device`, a parameter that receives a
device (`def train(args, model, device, ...)`), and a `--device` flag of
argparse. Codemods that need the device (autocast needs its type) start
from these.

A string device is also one read from a `--device` flag (`device =
args.device`, or `args.device` itself, kind "parsed", bound where the
arguments are parsed: `args = parser.parse_args()`) and one held under the "device" key of a module-level config
dict (`config = dict(device="cuda" if ... else "cpu")`, read as
`config["device"]`): `torch.device(...)` of either names the device.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst

from .._syntax import code_of
from . import vocabulary as v
from .entities import Entities
from .positions import Lines
from .scopes import Binding, Index, Scope

DEVICE_STRINGS = ("cuda", "cpu", "mps", "xpu")
DEVICE_PARAMETER_NAMES = v.DEVICE_PARAMETER_NAMES
# Flags that choose between the CPU and a GPU -> the test, of the flag's value, that the CPU is asked for
# (`--no-accel`: today's examples, with torch.accelerator).
CPU_CHOICE_FLAGS = {"--no-cuda": "{}", "--no_cuda": "{}", "--no-accel": "{}", "--no_accel": "{}", "--cpu": "{}", "--cuda": "not {}"}
DEVICE_FLAGS = frozenset({"--device", "--gpu", *CPU_CHOICE_FLAGS})
STRING_FLAGS = frozenset({"--device"})  # flags whose value names a device (`--gpu` is an index)


@dataclasses.dataclass(eq=False)
class DeviceBinding:
    """One binding of a device, as the script writes it."""

    name: str  # "device", "self.device", "args.device", "--device"
    kind: str  # "torch.device", "get_device", "string", "parameter", "flag", "parsed"
    node: cst.CSTNode = dataclasses.field(repr=False)  # the target, the Param, or the add_argument call
    scope: Scope = dataclasses.field(repr=False)
    lines: "Lines" = dataclasses.field(repr=False, compare=False)  # resolves `line` when asked
    value: str = ""  # the code of what it is bound to

    @property
    def line(self) -> int:
        return self.lines(self.node)

    def __repr__(self) -> str:
        shown = f" = {self.value}" if self.value else ""
        return f"DeviceBinding({self.name}{shown} [{self.kind}], line {self.line}, in {self.scope.name})"


def device_bindings(index: Index, entities: Entities, lines: Lines) -> list[DeviceBinding]:
    found = []
    flag_reads = {f[2:].replace("-", "_") for s in index.scopes for c in s.calls if (f := _device_flag(c)) in STRING_FLAGS}
    namespaces = _parsed_namespaces(index) if flag_reads else frozenset()
    for scope in index.scopes:
        for bindings in scope.bindings.values():
            for binding in bindings:
                kind = _device_kind(binding, entities)
                if kind is None and binding.kind == "assign" and _reads_flag(binding.value, flag_reads, namespaces):
                    kind = "string"
                key = _config_device_key(binding) if scope.kind == "module" else None
                if key is not None:
                    found.append(DeviceBinding(f'{binding.name}["{key}"]', "string", binding.node, scope, lines, code_of(binding.value)))
                if kind is not None:
                    value = code_of(binding.value) if binding.value is not None and kind != "parameter" else ""
                    found.append(DeviceBinding(binding.name, kind, binding.node, scope, lines, value))
                if binding.kind == "assign" and isinstance(binding.node, cst.Name) and _parses_arguments(binding.value):
                    value = code_of(binding.value)
                    found.extend(DeviceBinding(f"{binding.name}.{dest}", "parsed", binding.node, scope, lines, value) for dest in sorted(flag_reads))
        for call in scope.calls:
            flag = _device_flag(call)
            if flag is not None:
                found.append(DeviceBinding(flag, "flag", call, scope, lines, code_of(call)))
    return sorted(found, key=lambda d: index.order[d.node])


def _device_kind(binding: Binding, entities: Entities) -> Optional[str]:
    if binding.kind == "param":
        last = binding.name.rsplit("_", 1)[-1]
        default = binding.value
        if binding.name in DEVICE_PARAMETER_NAMES or last == "device" or (default is not None and is_device_string(default)):
            return "parameter"
        return None
    if binding.value is None or binding.kind != "assign":
        return None
    entity = entities.of_binding(binding)
    if entity is not None and entity.kind == "device":
        return "get_device" if entity.made_by.endswith("get_device") else "torch.device"
    return "string" if is_device_string(binding.value) else None


def is_device_string(value: cst.BaseExpression) -> bool:
    """"cuda", "cuda:0", f"cuda:{rank}", or a choice between such strings."""
    if isinstance(value, cst.IfExp):
        return is_device_string(value.body) and is_device_string(value.orelse)
    if isinstance(value, cst.SimpleString):
        text = value.evaluated_value
        return isinstance(text, str) and text.split(":")[0] in DEVICE_STRINGS
    if isinstance(value, cst.FormattedString):
        first = value.parts[0] if value.parts else None
        return isinstance(first, cst.FormattedStringText) and first.value.split(":")[0] in DEVICE_STRINGS
    return False


def _reads_flag(value: Optional[cst.BaseExpression], dests: set, namespaces: frozenset) -> bool:
    """`args.device`, where the file declares `--device` and binds `args` to the parsed arguments (a tensor's own
    `x.device` is no flag); any `name.device` where the file parses its arguments out of sight."""
    return (
        isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) and value.attr.value in dests
        and (not namespaces or value.value.value in namespaces)
    )


def _parsed_namespaces(index: Index) -> frozenset:
    """The names the file binds to its parsed arguments (`args = parser.parse_args()`); a function's parameter of
    the same name receives them."""
    return frozenset(
        binding.name for scope in index.scopes for bindings in scope.bindings.values() for binding in bindings
        if binding.kind == "assign" and isinstance(binding.node, cst.Name) and _parses_arguments(binding.value)
    )


def _parses_arguments(value: Optional[cst.BaseExpression]) -> bool:
    """`parser.parse_args()`, `parser.parse_known_args()[0]`."""
    method = "parse_args"
    if isinstance(value, cst.Subscript) and code_of(value.slice[0]) == "0":
        value, method = value.value, "parse_known_args"
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == method


def _config_device_key(binding: Binding) -> Optional[str]:
    """"device" when `binding` (a name bound once) holds a dict literal or
    `dict(...)` call whose "device" entry is a device string."""
    value = binding.value
    if binding.kind != "assign" or not isinstance(binding.node, cst.Name) or len(binding.scope.bindings.get(binding.name, ())) != 1:
        return None
    if isinstance(value, cst.Dict):
        entries = [(e.key.evaluated_value, e.value) for e in value.elements if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)]
    elif isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict":
        entries = [(a.keyword.value, a.value) for a in value.args if a.keyword is not None]
    else:
        return None
    return next((key for key, entry in entries if key == "device" and is_device_string(entry)), None)


def _device_flag(call: cst.Call) -> Optional[str]:
    """`parser.add_argument("--device", ...)`: the flag."""
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"):
        return None
    for arg in call.args:
        if arg.keyword is None and isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value in DEVICE_FLAGS:
            return arg.value.evaluated_value
    return None


__all__ = ["DeviceBinding", "device_bindings", "is_device_string"]
