"""What the `device` codemod matches by name, what its literals mean, and its
messages."""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import libcst as cst

from ..script.vocabulary import (  # noqa: F401  (shared with the pre-check rule)
    CUDA_DEVICE_CONTEXT, IS_AVAILABLE, LEGACY_DTYPES, LEGACY_TYPES, NEEDS_GPU, SET_DEVICE,
)

RUNTIME_MODULE = "accelmigrate.runtime.device"
GET_DEVICE = {f"{RUNTIME_MODULE}.get_device", "accelmigrate.runtime.get_device"}
DEVICE_AT = f"{RUNTIME_MODULE}.device_at"
TORCH_DEVICE = {"torch.device"}
TORCH_LOAD = {"torch.load", "torch.serialization.load"}
# What the launcher says this process's local rank is: get_device() picks the same GPU.
LOCAL_RANK_FUNCTIONS = {"torch.distributed.get_node_local_rank", "accelmigrate.runtime.env.local_rank"}
ENVIRON = {"os.environ"}
ENVIRON_GETTERS = {"os.environ.get", "os.getenv"}
LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")  # torch.distributed.launch passes it
# Blocks whose body is expected to raise: what they run is the test's point.
EXPECTS_ERROR_METHODS = {"assertRaises", "assertRaisesRegex", "assertRaisesRegexp"}
EXPECTS_ERROR_FUNCTIONS = {"pytest.raises"}
SET_DEFAULT_DEVICE = {"torch.set_default_device"}
INIT_PROCESS_GROUP = {"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group"}
BACKEND_MODULE = "accelmigrate.runtime.backend"
DEFAULT_BACKEND = f"{BACKEND_MODULE}.default_backend"
LEGACY_MODULE = "accelmigrate.runtime.legacy"
TENSOR_TYPE = f"{LEGACY_MODULE}.tensor_type"
# Callables under torch whose `device` argument is a string by contract.
STRING_DEVICE_APIS = ("torch.amp.", "torch.cuda.", "torch.autocast", "torch.cpu.amp.")
# Tensor and Module methods that take `device=`.
DEVICE_METHODS = {"to", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "to_empty"}
# Names tried, in order, for the binding of the device.
BINDING_NAMES = ("device", "compute_device", "torch_device")
GET_DEVICE_NAMES = ("get_device", "accelmigrate_get_device")

# What a file is (see Device._file_role): who chooses the device.
SCRIPT, SELF_TEST, LIBRARY = "script", "self-test", "library"

# -- messages -----------------------------------------------------------------------------

STRING_DEVICE_ADVICE = (
    "string device not only passed on as a device (compared, used as text, or read where it cannot be seen): "
    "get_device() returns a torch.device, and torch.device('cuda:0') == 'cuda' is False; "
    "replace it by get_device() by hand and compare `device.type`"
)
LIBRARY_DEFINITION_ADVICE = (
    "CUDA device definition in a module without a training loop or an entry point (a library): left as it is, "
    "get_device() would choose and set the GPU where the library is imported or called; "
    "choose the device in the script and pass it in"
)
DEFAULT_ADVICE = (
    "hard-coded CUDA device as a parameter default: a default is evaluated at import, so it is not "
    "rewritten to the run-time device; pass the caller's device (the script's `get_device()`) instead"
)
COMPUTED_ADVICE = (
    "GPU index known only at run time (a rank from mp.spawn, a loop over GPUs, a --gpu flag): left alone, "
    "each process keeps the GPU it names; under torchrun, use `device = get_device()` (cuda:<LOCAL_RANK>) by hand"
)
PASSED_IN_ADVICE = (
    "a passed-in device may be None or an index, and `.to(None)` moves nothing: left alone; "
    "write `.to(device)` by hand if it always holds a device"
)
LIBRARY_ADVICE = (
    "left alone in a module without a training loop or an entry point (a library), where no device that it "
    "defines is in reach: a module-level `device = get_device()` would choose and set the GPU when it is "
    "imported; migrate it with the script that imports it (`apply train.py` follows its imports), or take the "
    "device from a tensor at hand (`x.device`) or from the caller"
)
SELF_TEST_ADVICE = (
    "left alone in a function of a library module whose main guard only exercises it (the module declares "
    "`__all__`, or its guard runs no function that places on a device): a module-level `device = get_device()` "
    "would choose and set the GPU wherever the module is imported; take the device from a tensor at hand "
    "(`x.device`) or from the caller"
)
SELF_TEST_DEFINITION_ADVICE = (
    "CUDA device definition in a function of a library module whose main guard only exercises it: left as it "
    "is, get_device() would choose and set the GPU where it is called; choose the device in the script and pass it in"
)
NEEDS_GPU_ADVICE = "this torch.cuda call fails without a GPU: run it only when `device.type == \"cuda\"`"
LEGACY_VALUE_ADVICE = (
    "legacy CUDA tensor type used as a value: create tensors with `device=device` (e.g. `torch.ones(n, 1, "
    "device=device)`) or `.to(device)`; `x.type(torch.cuda.FloatTensor)` -> `x.to(device, torch.float32)`"
)
SET_DEVICE_ADVICE = (
    "torch.cuda.set_device(...) fails without CUDA: run it only under `if torch.cuda.is_available():` "
    "(keep it: NCCL and plain \"cuda\" use the GPU it selects)"
)
SET_DEVICE_GUARDED = (
    "torch.cuda.set_device(...) runs only under `if torch.cuda.is_available():`: on a GPU it still selects "
    "the process's GPU before NCCL starts"
)

# -- reading literals ---------------------------------------------------------------------

ANY_GPU = "any"  # "cuda": the runtime's device serves it
ZERO_GPU = "zero"  # "cuda:0", 0: the first GPU, named explicitly
OTHER_GPU = "other"  # "cuda:1", 1: an explicit second GPU
COMPUTED_GPU = "computed"  # f"cuda:{i}": an index known only at run time

# What a device expression is (and COMPUTED_GPU: an index computed at run time).
CUDA = "cuda"  # the default GPU: the runtime's device replaces it
CPU = "cpu"
RUNTIME = "runtime"  # already get_device()
SOME_DEVICE = "device"  # a torch.device we cannot read (torch.device(args.device))
EXPLICIT_GPU = "explicit"  # a GPU other than 0
VARIABLE_GPU = "variable"  # `.cuda(device)` with a device variable in reach


def cuda_literal(node: cst.CSTNode) -> Optional[str]:
    """ANY_GPU, ZERO_GPU or OTHER_GPU when `node` is a string naming a CUDA
    device, COMPUTED_GPU when it formats an index into one, else None."""
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        value = node.evaluated_value
        if not isinstance(value, str):
            return None
        return _cuda_text(value)
    if formatted_index(node) is not None:
        return COMPUTED_GPU
    return None


def formatted_index(node: Optional[cst.CSTNode]) -> Optional[cst.BaseExpression]:
    """The index of `f"cuda:{i}"`, `"cuda:{}".format(i)`, `"cuda:%d" % i`,
    `"cuda:" + str(i)`; None for anything else."""
    if isinstance(node, cst.FormattedString):
        parts = node.parts
        if (
            len(parts) == 2
            and isinstance(parts[0], cst.FormattedStringText)
            and parts[0].value == "cuda:"
            and isinstance(parts[1], cst.FormattedStringExpression)
        ):
            return parts[1].expression
        return None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format":
        if string_value(node.func.value) in ("cuda:{}", "cuda:{0}") and len(node.args) == 1 and not node.args[0].star:
            return node.args[0].value
        return None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
        return node.right if string_value(node.left) in ("cuda:%d", "cuda:%s", "cuda:%i") else None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add) and string_value(node.left) == "cuda:":
        right = node.right
        if isinstance(right, cst.Call) and isinstance(right.func, cst.Name) and right.func.value == "str" and len(right.args) == 1:
            return right.args[0].value
        return right
    return None


def string_value(node: cst.CSTNode) -> Optional[str]:
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _cuda_text(value: str) -> Optional[str]:
    if value == "cuda":
        return ANY_GPU
    kind, _, index = value.partition(":")
    if kind != "cuda" or not index.isdigit():
        return None
    return ZERO_GPU if int(index) == 0 else OTHER_GPU


def gpu_index(node: cst.CSTNode) -> Optional[str]:
    """ZERO_GPU or OTHER_GPU for a literal GPU index (`0`, `1`) or device string
    (`"cuda:1"`), ANY_GPU for "cuda", None for anything else (a variable)."""
    value = integer_value(node)
    if value is not None:
        return ZERO_GPU if value == 0 else OTHER_GPU
    return cuda_literal(node)


def is_cpu_literal(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.SimpleString) and node.evaluated_value == "cpu"


def integer_value(node: cst.CSTNode) -> Optional[int]:
    return int(node.value, 0) if isinstance(node, cst.Integer) else None


def method_name(call: cst.Call) -> Optional[str]:
    """`x.cuda()` -> "cuda"; None when the call is not a method call."""
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None


def positional(call: cst.Call) -> list[cst.Arg]:
    return [arg for arg in call.args if arg.keyword is None and not arg.star]


# -- what the planner knows about device values --------------------------------------------


@dataclasses.dataclass
class DeviceValue:
    """What an expression evaluates to, as far as placement goes."""

    kind: str  # CUDA, CPU, RUNTIME, SOME_DEVICE, EXPLICIT_GPU, COMPUTED_GPU, or "choice"
    is_string: bool = False
    # a choice `A if test else B` between a CUDA and a CPU branch
    test: Optional[cst.BaseExpression] = None
    cuda_first: bool = True  # the CUDA branch is the `if` branch


@dataclasses.dataclass
class Definition:
    """`target = value` where the value is a device (or a device name)."""

    target: Union[cst.Name, cst.Attribute]
    value: cst.BaseExpression
    statement: cst.BaseSmallStatement
    device: DeviceValue
    # May sites use this target as their device? Only a device variable
    # (named so, or holding a torch.device) that is not an explicit GPU and
    # not the CPU unconditionally: `.cuda()` must not become `.to(<cpu>)`.
    usable: bool = True
    cpu_branch: bool = False  # `device = torch.device("cpu")` in an `else:`


def last_name(target: cst.BaseExpression) -> str:
    """`device` -> "device", `self.device` -> "device"."""
    return target.attr.value if isinstance(target, cst.Attribute) else getattr(target, "value", "")


# Calls whose first argument is a device type name.
AUTOCAST = frozenset({"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"})


def string_verdict(uses: Optional[list], name: str) -> str:
    """What to do with a string "cuda" bound to `name` and read as `uses`:
    "rewrite" it to the runtime's device when it is passed on as a device and
    otherwise at most printed or compared with a type (the comparison then
    reads `.type`); "skip" a string never used as a device whose name does not
    say device, or says or is read as a device type (`device_type`, autocast's
    `device_type=`); "report" the rest."""
    if uses is not None and set(uses) <= {"device", "text", "compare"} and "device" in uses:
        return "rewrite"
    if uses is not None and "device" not in uses:
        if "dev" not in name.lower() or name.lower().endswith("type") or "type" in uses:
            return "skip"
    return "report"
