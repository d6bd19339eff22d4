"""device: one device, chosen at run time, instead of hard-coded CUDA placements.

What it does
    Rewrites every hard-coded CUDA placement to one device that the runtime
    chooses when the script starts (`cuda:<local rank>` when CUDA is there,
    else `mps` on Apple silicon, else `cpu`), bound once to a `device` name
    and reused:

    - `x.cuda()`, `x.cuda(0)`, `x.cuda(device=dev)` (a device variable) on a
      tensor, a module, a criterion or a `Variable` -> `x.to(device)`
      (`non_blocking` and `memory_format` are kept; `Module.to` and
      `Tensor.to` both take a device, with the same semantics as `.cuda()`);
    - `x.to("cuda")`, `x.to("cuda:0")`, `torch.device("cuda")`,
      `device="cuda"` given to a torch callable (`torch.zeros`, `torch.randn`,
      `torch.tensor`, `torch.arange`, `nn.Linear`...) or to a tensor method
      (`x.new_zeros`), `torch.set_default_device("cuda")` -> `device`;
    - an index that is the launcher's local rank (`int(os.environ["LOCAL_RANK"])`,
      a name bound only to it, `args.local_rank` of a `--local_rank` flag):
      `x.cuda(local_rank)`, `f"cuda:{local_rank}"`, `torch.device("cuda",
      local_rank)` -> `device`, which is that GPU;
    - a device definition that is CUDA-only or falls back on
      `torch.cuda.is_available()` (`device = torch.device("cuda" if
      torch.cuda.is_available() else "cpu")`, `self.device = ...`,
      `args.device = ...`) -> `get_device()`. One that follows a user's flag
      (`torch.device("cuda" if args.cuda else "cpu")`) keeps the flag:
      `get_device() if args.cuda else torch.device("cpu")`. Both are replaced
      rather than kept, so that the `ddp` codemod finds one per-process device
      and Apple silicon gets `mps`; `ACCELMIGRATE_DEVICE=cpu` forces the CPU;
    - `torch.load(f)` without `map_location` -> `torch.load(f,
      map_location=device)`: tensors load where the script computes, so a
      checkpoint saved on a GPU loads on a CPU, and each DDP rank loads onto
      its own GPU instead of all of them onto GPU 0 (`"cpu"` would also load
      everywhere, but would leave tensors that the script uses directly on
      the wrong device). A file that places nothing on a device gets
      `map_location="cpu"`: it computes on the CPU. `map_location="cuda:0"`
      and `lambda storage, loc: storage.cuda()` become `device` too;
    - `torch.cuda.FloatTensor(...)` (and the other legacy CUDA tensor types)
      -> `torch.FloatTensor(...).to(device)`;
    - `x.cuda().cuda()` -> `x.to(device)` (the second move does nothing);
    - `torch.cuda.set_device(...)` is removed (with an `if` around it that
      does nothing else): `get_device()` makes its GPU the current device;
    - `if torch.cuda.is_available():` (or a `use_cuda` name assigned from it)
      around nothing but device moves is dropped, and so is
      `x.cuda() if use_cuda else x`: `.to(device)` is a no-op on the CPU.
      A guard on a user's flag (`if args.cuda: model.cuda()`) stays, with
      the moves inside rewritten.

    The device comes from the script's own device variable when one is in
    reach and certainly assigned by then (`device`, `dev`, `self.device` set
    in `__init__`, `args.device` set earlier in the function, a `device`
    parameter without a default or defaulting to the GPU); otherwise from
    `device = get_device()`, added at module level after the imports. When
    `device` already means something else (an index, the CPU), the binding
    takes a free name (`compute_device`).

    Only a file that runs as a script chooses the device: one with an entry point
    (a main guard), a training loop (`loss.backward()` in a loop that also
    calls `optimizer.step()`), or work done at import (a flat script: CUDA
    placements, `torch.load`, `parser.parse_args()`).
    A library module (models, helpers, a test suite's utilities) gets no
    module-level `device = get_device()`, which would choose and set the GPU
    when it is imported, and its device definitions are kept: there a
    placement follows only a device variable that the module itself defines
    (not a parameter, which is the caller's), and is otherwise reported, as
    is a `torch.load` with no such device (AM311, AM303).

Why
    A script that hard-codes `.cuda()` runs on one GPU only: not on a CPU
    (tests, CI, a laptop), not on Apple silicon, and under torchrun every
    process piles onto GPU 0. One device chosen in one place is the
    precondition for DDP (the `ddp` codemod builds on `device = get_device()`
    and `.to(device)`), and `.to(device)` is a no-op when the tensor is
    already there.

Example
    Before::

        import torch

        model = Net().cuda()
        for x, y in loader:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            loss = criterion(model(x), y)

    After::

        import torch
        from accelmigrate.runtime.device import get_device

        device = get_device()

        model = Net().to(device)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = criterion(model(x), y)

Left alone (with a finding that says what to do)
    - an explicit GPU other than 0 (`.cuda(1)`, `"cuda:1"`,
      `torch.device("cuda", 1)`), and every explicit GPU, 0 included, in a
      file that names one other than 0: model parallelism or a deliberate
      choice (AM310);
    - a GPU index known only at run time that is not the launcher's local
      rank (`.cuda(rank)` under `mp.spawn`, `.cuda(self.rank)`, `.cuda(i)` in
      a loop over GPUs, `torch.device("cuda", i)`, `f"cuda:{i}"`, a `--gpu`
      flag): each process keeps the GPU it names, which the one run-time
      device would not (DDP's `device_ids=[rank]` would disagree with it);
      `.cuda(device)` of a passed-in device that may be None (`.to(None)`
      moves nothing); and in a file that makes such a GPU current
      (`torch.cuda.set_device(rank)`, `with torch.cuda.device(i):`), every
      placement, since plain "cuda" means that GPU there (AM313);
    - a parameter default (`def f(device="cuda")`): it is evaluated at
      import, so it never refers to the run-time device (AM302);
    - `x.cpu().cuda()`: a copy to the host and back, rewritten to
      `x.cpu().to(device)` so the copy is kept, and reported (AM306);
    - calls that need a GPU to run (`torch.cuda.synchronize()`,
      `torch.cuda.Event`...) outside a CUDA check (AM312);
    - a place where no device name can be used safely (it is assigned only
      later in the function, or every candidate name is taken), `.cuda(*args)`
      and `torch.Tensor.cuda(x)` (AM311);
    - a string device (`device = "cuda"`) that is compared or used as text,
      or read where its uses cannot be seen (`self.device`, `Config.device`):
      `torch.device("cuda:0") == "cuda"` is False (AM303, AM302); a string
      that merely says "cuda" and is never used as a device is not touched;
    - `parser.add_argument("--device", default="cuda")` (AM302, unfixed);
    - legacy CUDA tensor types used as values (`x.type(torch.cuda.FloatTensor)`,
      `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`) (AM308);
    - `"cuda"` given to a function that is not torch's (AM302, unfixed);
      `device_type="cuda"`, `torch.autocast("cuda")` and
      `GradScaler(device="cuda")`, which take the string by contract (the
      `amp` codemod's concern), without a finding;
    - code inside `with self.assertRaises(...):` or `with pytest.raises(...):`,
      which a test expects to fail, without a finding.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional, Sequence, Union

import libcst as cst
from libcst.metadata import ClassScope, GlobalScope, PositionProvider, ScopeProvider

from ._base import Codemod, append_keyword_args, code_of, has_star_args, is_main_guard, keyword_arg, walk

RUNTIME_MODULE = "accelmigrate.runtime.device"
GET_DEVICE = {f"{RUNTIME_MODULE}.get_device", "accelmigrate.runtime.get_device"}
TORCH_DEVICE = {"torch.device"}
TORCH_LOAD = {"torch.load", "torch.serialization.load"}
SET_DEVICE = {"torch.cuda.set_device"}
CUDA_DEVICE_CONTEXT = {"torch.cuda.device"}  # `with torch.cuda.device(i):`
# What the launcher says this process's local rank is: get_device() picks the same GPU.
LOCAL_RANK_FUNCTIONS = {"torch.distributed.get_node_local_rank", "accelmigrate.runtime.env.local_rank"}
ENVIRON = {"os.environ"}
ENVIRON_GETTERS = {"os.environ.get", "os.getenv"}
LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")  # torch.distributed.launch passes it
# Blocks whose body is expected to raise: what they run is the test's point.
EXPECTS_ERROR_METHODS = {"assertRaises", "assertRaisesRegex", "assertRaisesRegexp"}
EXPECTS_ERROR_FUNCTIONS = {"pytest.raises"}
IS_AVAILABLE = {"torch.cuda.is_available"}
SET_DEFAULT_DEVICE = {"torch.set_default_device"}
LEGACY_TYPES = {
    f"torch.cuda.{kind}Tensor"
    for kind in ("Float", "Double", "Half", "BFloat16", "Byte", "Char", "Short", "Int", "Long", "Bool")
}
# torch.cuda functions that raise without a GPU (CPU builds assert on them).
NEEDS_GPU = {
    f"torch.cuda.{name}"
    for name in (
        "synchronize", "current_device", "get_device_name", "get_device_properties",
        "get_device_capability", "reset_peak_memory_stats", "reset_max_memory_allocated",
        "Event", "Stream", "current_stream", "default_stream", "stream", "set_stream",
    )
}
# Callables under torch whose `device` argument is a string by contract.
STRING_DEVICE_APIS = ("torch.amp.", "torch.cuda.", "torch.autocast", "torch.cpu.amp.")
# Tensor and Module methods that take `device=`.
DEVICE_METHODS = {"to", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "to_empty"}
# Names tried, in order, for the module-level binding.
BINDING_NAMES = ("device", "compute_device", "torch_device")
GET_DEVICE_NAMES = ("get_device", "accelmigrate_get_device")

Edit = Callable[[cst.CSTNode], cst.CSTNode]

STRING_DEVICE_ADVICE = (
    "string device not only passed on as a device (compared, used as text, or read where it cannot be seen): "
    "get_device() returns a torch.device, and torch.device('cuda:0') == 'cuda' is False; "
    "replace it by get_device() by hand and compare `device.type`"
)


# -- reading literals ---------------------------------------------------------------------

ANY_GPU = "any"  # "cuda": the runtime's device serves it
ZERO_GPU = "zero"  # "cuda:0", 0: the first GPU, named explicitly
OTHER_GPU = "other"  # "cuda:1", 1: an explicit second GPU
COMPUTED_GPU = "computed"  # f"cuda:{i}": an index known only at run time


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


def formatted_index(node: cst.CSTNode) -> Optional[cst.BaseExpression]:
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
        if _string_value(node.func.value) in ("cuda:{}", "cuda:{0}") and len(node.args) == 1 and not node.args[0].star:
            return node.args[0].value
        return None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
        return node.right if _string_value(node.left) in ("cuda:%d", "cuda:%s", "cuda:%i") else None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add) and _string_value(node.left) == "cuda:":
        right = node.right
        if isinstance(right, cst.Call) and isinstance(right.func, cst.Name) and right.func.value == "str" and len(right.args) == 1:
            return right.args[0].value
        return right
    return None


def _string_value(node: cst.CSTNode) -> Optional[str]:
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


# -- what a device expression is -----------------------------------------------------------

CUDA = "cuda"  # the default GPU: the runtime's device replaces it
CPU = "cpu"
RUNTIME = "runtime"  # already get_device()
SOME_DEVICE = "device"  # a torch.device we cannot read (torch.device(args.device))
EXPLICIT_GPU = "explicit"  # a GPU other than 0
# COMPUTED_GPU: a GPU index computed at run time (a rank, a loop variable)
VARIABLE_GPU = "variable"  # `.cuda(device)` with a device variable in reach

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
    "imported; take the device from a tensor at hand (`x.device`) or from the caller"
)


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


class Device(Codemod):
    word = "device"
    summary = "hard-coded .cuda() / 'cuda' placements -> one device chosen at run time (get_device())"
    codes = {
        "AM301": ".cuda() -> .to(device)",
        "AM302": "hard-coded CUDA device ('cuda', torch.device('cuda')) -> device",
        "AM303": "CUDA device definition -> get_device()",
        "AM304": "torch.load without map_location -> map_location=device",
        "AM305": "redundant second device move removed",
        "AM306": ".cpu().cuda(): a round trip through the host",
        "AM307": "torch.cuda.set_device(...) removed: the runtime sets the device",
        "AM308": "legacy CUDA tensor type",
        "AM309": "CUDA availability check around device moves removed",
        "AM310": "explicit GPU other than 0: left alone",
        "AM311": "no device name can be used here: move by hand",
        "AM312": "call that needs a GPU to run",
        "AM313": "GPU index computed at run time (a rank, a loop variable, a passed-in device): left alone",
    }
    # Every match contains "cuda" (`.cuda(`, "cuda" strings, `torch.cuda.`,
    # `from torch import cuda`) or "load" (`torch.load`, `from torch import load`).
    triggers = ("cuda", "load")
    METADATA_DEPENDENCIES = (*Codemod.METADATA_DEPENDENCIES, ScopeProvider)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._edits: dict[cst.CSTNode, Edit] = {}
        self._dropped: set[cst.CSTNode] = set()  # statements removed
        self._unwrapped: set[cst.If] = set()  # ifs replaced by their body
        self._anchor: Optional[cst.CSTNode] = None  # the binding goes after it
        self._binding_at_top = False
        self._binding_name = "device"
        self._get_device_name = "get_device"
        self._uses_runtime = False
        self._several_gpus = False  # the file names a GPU other than 0

    # -- planning ---------------------------------------------------------------------------

    def visit_Module(self, node: cst.Module) -> bool:
        self._module = node
        found = _Collector()
        node.visit(found)
        self._found = found
        self._choose_get_device_name()
        self._several_gpus = any(self._names_other_gpu(call) for call in found.calls) or any(
            cuda_literal(statement.value) == OTHER_GPU for _, statement in found.assignments
        )
        self._local_rank_flag = any(self._declares_local_rank_flag(call) for call in found.calls)
        self._definitions = self._read_definitions(found.assignments)
        self._definition_nodes = _all_nodes(d.value for d in self._definitions)
        self._is_script = self._runs_as_script(node, found.calls)
        self._gpu_choice = self._file_chooses_its_gpu(found.calls)
        self._plan_definitions()
        self._fallback_sites: list[cst.CSTNode] = []  # rewritten with the module binding
        self._needs_binding: set[cst.CSTNode] = set()
        self._choose_binding_name(found)
        self._needs_binding.clear()
        self._plan_calls(found.calls)
        self._plan_parameter_defaults(found.parameters)
        self._plan_guards(found.ifs, found.conditionals)
        self._plan_set_device(found.calls)
        self._report_legacy_references(found.legacy_references)
        self._plan_binding()
        return True

    # Which names: the runtime's function and the module-level binding.

    def _choose_get_device_name(self) -> None:
        taken = self._module_binds("get_device", allow=GET_DEVICE)
        self._get_device_name = GET_DEVICE_NAMES[1] if taken else GET_DEVICE_NAMES[0]

    def _module_binds(self, name: str, allow: set[str]) -> bool:
        """Does the module bind `name` to something other than one of `allow`?"""
        scope = self._global_scope()
        if scope is None or name not in scope.assignments:
            return False
        for assignment in scope.assignments[name]:
            names = {q.name for q in assignment.get_qualified_names_for(name)}
            if names.isdisjoint(allow):
                return True
        return False

    def _global_scope(self) -> Optional[GlobalScope]:
        scope = self.get_metadata(ScopeProvider, self._module, None)
        return scope.globals if scope is not None else None

    def _choose_binding_name(self, found: "_Collector") -> None:
        """`device`, unless that name means something else where it is needed."""
        for name in BINDING_NAMES:
            if name != "device" and name in found.all_names:
                continue
            if self._binding_name_fits(name, found):
                self._binding_name = name
                return
        self._binding_name = ""  # nothing fits: every site that needs it is reported

    def _binding_name_fits(self, name: str, found: "_Collector") -> bool:
        self._binding_name = name
        module_scope = self._global_scope()
        if module_scope is not None and name in module_scope.assignments:
            if not all(self._is_device_assignment(a) for a in module_scope.assignments[name]):
                return False
        for call in found.calls:
            if self._needs_device(call) and self._placement(call) == "":
                return False
        return True

    def _needs_device(self, call: cst.Call) -> bool:
        """Could this call be rewritten with a device name (ignoring suppressions)?"""
        return (
            self._move_kind(call) is not None
            or self._is_load_without_map(call)
            or any(True for _ in self._device_string_arguments(call))
        )

    # Explicit GPUs.

    def _names_other_gpu(self, call: cst.Call) -> bool:
        """`.cuda(1)`, `torch.device("cuda", 1)`, `set_device(1)`, `"cuda:1"`."""
        if any(cuda_literal(arg.value) == OTHER_GPU for arg in call.args):
            return True
        indexed = method_name(call) == "cuda" or self.is_call_to(call, TORCH_DEVICE | SET_DEVICE)
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

    def _constant_of(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """The integer a name is always bound to (`LOCAL_RANK = 0`), else `node`."""
        if not isinstance(node, cst.Name):
            return node
        scope = self.get_metadata(ScopeProvider, node, None)
        assignments = scope[node.value] if scope is not None else ()
        values = [self._found.assignment_of.get(getattr(a, "node", None)) for a in assignments]
        if not values or any(v is None or integer_value(v.value) is None for v in values):
            return node
        first = values[0].value
        return first if all(integer_value(v.value) == integer_value(first) for v in values) else node

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
            return self._name_is_local_rank(node, depth)
        if isinstance(node, cst.Attribute) and node.attr.value == "local_rank":
            return self._local_rank_flag and all(
                self._is_local_rank(statement.value, depth + 1)
                for target, statement in self._found.assignments
                if isinstance(target, cst.Attribute) and target.attr.value == "local_rank"
            )
        return False

    def _reads_local_rank_variable(self, node: cst.BaseExpression) -> bool:
        """`os.environ["LOCAL_RANK"]`, `os.environ.get("LOCAL_RANK", ...)`, `os.getenv("LOCAL_RANK")`."""
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            key = node.slice[0].slice.value
            return self.is_qualified(node.value, ENVIRON) and _string_value(key) == "LOCAL_RANK"
        if isinstance(node, cst.Call) and self.is_call_to(node, ENVIRON_GETTERS) and node.args:
            return node.args[0].keyword is None and _string_value(node.args[0].value) == "LOCAL_RANK"
        return False

    def _name_is_local_rank(self, name: cst.Name, depth: int) -> bool:
        scope = self.get_metadata(ScopeProvider, name, None)
        assignments = scope[name.value] if scope is not None else ()
        if not assignments:
            return False
        for assignment in assignments:
            statement = self._found.assignment_of.get(getattr(assignment, "node", None))
            if statement is None or not self._is_local_rank(statement.value, depth + 1):
                return False
        return True

    def _declares_local_rank_flag(self, call: cst.Call) -> bool:
        """`parser.add_argument("--local_rank", ...)`: the flag by which
        torch.distributed.launch gives each process its local rank."""
        return method_name(call) == "add_argument" and any(
            _string_value(arg.value) in LOCAL_RANK_FLAGS for arg in positional(call)
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

    def _names_a_parameter(self, placement: str, site: cst.CSTNode) -> bool:
        if "." in placement:
            return False  # `self.device`, set in `__init__`
        scope = self.get_metadata(ScopeProvider, site, None)
        return scope is None or any(isinstance(getattr(a, "node", None), cst.Param) for a in scope[placement])

    def _is_parameter(self, node: cst.BaseExpression, defaulting_to_none: bool = False) -> bool:
        """Is `node` a name bound by a parameter (one whose default is None)?"""
        scope = self.get_metadata(ScopeProvider, node, None) if isinstance(node, cst.Name) else None
        params = [a.node for a in scope[node.value] if isinstance(getattr(a, "node", None), cst.Param)] if scope else []
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
            if self._index_kind(call.args[0].value) in (EXPLICIT_GPU, COMPUTED_GPU) and not self._is_device_variable(call.args[0].value, call):
                return call
        return None

    def _gpu_choice_reason(self) -> str:
        call = self._gpu_choice
        line = self.get_metadata(PositionProvider, call).start.line
        return (
            f"this file selects its GPU itself (`{code_of(call)}`, line {line}), so plain CUDA placements mean "
            "that GPU: left alone; migrate the file by hand (under torchrun, `device = get_device()` is cuda:<LOCAL_RANK>)"
        )

    # Library modules, and code that runs at import or expects an error.

    def _runs_as_script(self, module: cst.Module, calls: Sequence[cst.Call]) -> bool:
        """Does the file run as a script: an entry point (a main guard), a
        training loop, or CUDA work done at import? Only then does it choose
        the device (a library's callers choose it)."""
        if any(isinstance(statement, cst.If) and is_main_guard(statement.test) for statement in module.body):
            return True
        return any(
            self._is_training_step(call)
            or self._uses_cuda_at_import(call)
            or (self.is_call_to(call, TORCH_LOAD) and self._runs_at_import(call))  # loads when it runs
            or (method_name(call) == "parse_args" and self._runs_at_import(call))  # reads its command line
            for call in calls
        )

    def _is_training_step(self, call: cst.Call) -> bool:
        """`loss.backward()` in a loop that also steps (`optimizer.step()`): a
        training loop, not a test's or a helper's single backward pass."""
        if method_name(call) != "backward" or any(name.startswith("torch.") for name in self.qualified_names(call.func)):
            return False
        loop = self.innermost_loop(call)
        return loop is not None and any(
            isinstance(node, cst.Call) and method_name(node) == "step" for node in walk(loop.body, into_definitions=False)
        )

    def _uses_cuda_at_import(self, call: cst.Call) -> bool:
        """A `.cuda()`, a legacy CUDA constructor or a placement on "cuda" or
        on a device variable that runs when the module is imported: the module
        already picks its device at import."""
        if not self._runs_at_import(call) or self._expects_error(call):
            return False
        kind = self._move_kind(call)
        if kind is not None:
            return kind != "torch.device"
        if self.is_call_to(call, SET_DEFAULT_DEVICE):
            return False
        if any(True for _ in self._device_string_arguments(call)):
            return True
        placed = keyword_arg(call, "device") or (call.args[0] if method_name(call) == "to" and call.args else None)
        return placed is not None and isinstance(placed.value, cst.Name) and self._name_resolves_to_devices(call, placed.value.value)

    def _runs_at_import(self, node: cst.CSTNode) -> bool:
        """Outside every function and lambda (a parameter default counts as
        inside: it is not where the work is done)."""
        return not any(isinstance(ancestor, (cst.FunctionDef, cst.Lambda)) for ancestor in self.ancestors(node))

    def _expects_error(self, node: cst.CSTNode) -> bool:
        """Inside `with self.assertRaises(...):` or `with pytest.raises(...):`."""
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.With) and child is ancestor.body:
                for item in ancestor.items:
                    call = item.item
                    if isinstance(call, cst.Call) and (
                        method_name(call) in EXPECTS_ERROR_METHODS or self.is_call_to(call, EXPECTS_ERROR_FUNCTIONS)
                    ):
                        return True
            child = ancestor
        return False

    def _in_parameter_default(self, node: cst.CSTNode) -> bool:
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.Param) and child is ancestor.default:
                return True
            if isinstance(ancestor, (cst.BaseSuite, cst.Module)):
                return False
            child = ancestor
        return False

    # Definitions of a device variable.

    def _read_definitions(self, assignments: Sequence[tuple[cst.CSTNode, cst.BaseSmallStatement]]) -> list[Definition]:
        definitions = []
        for target, statement in assignments:
            value = statement.value
            device = self._device_value(value)
            if device is not None:
                typed = not device.is_string
                usable = (typed or "dev" in _last_name(target).lower()) and device.kind not in (EXPLICIT_GPU, COMPUTED_GPU)
                definitions.append(Definition(target, value, statement, device, usable=usable))
        self._definition_of = {d.statement: d for d in definitions}
        for definition in definitions:
            if definition.device.kind == CPU and definition.usable:
                definition.usable = False
                definition.cpu_branch = True  # usable only in an if/else, see _device_target_of
        return definitions

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

    def _plan_definitions(self) -> None:
        for definition in self._definitions:
            device = definition.device
            if self._expects_error(definition.value):
                continue
            if device.kind == EXPLICIT_GPU:
                definition.usable = False
                self.report(definition.value, "AM310", self._explicit_reason() + "; use get_device() if one GPU per process is meant")
            elif device.kind == COMPUTED_GPU:
                self.report(definition.value, "AM313", COMPUTED_ADVICE)
            elif device.kind == CUDA or device.kind == "choice":
                self._plan_definition(definition)

    def _plan_definition(self, definition: Definition) -> None:
        device = definition.device
        if device.is_string:
            verdict = _string_verdict(self._string_uses(definition), _last_name(definition.target))
            if verdict == "report":
                self.report(definition.value, "AM303", STRING_DEVICE_ADVICE)
            if verdict != "rewrite":
                return
        if self._gpu_choice is not None:
            self.report(definition.value, "AM313", f"CUDA device definition: {self._gpu_choice_reason()}")
            return
        if not self._is_script:
            self.report(definition.value, "AM303", LIBRARY_DEFINITION_ADVICE)
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

    def _flag_choice(self, updated: cst.BaseExpression, device: DeviceValue) -> cst.BaseExpression:
        """`torch.device("cuda" if flag else "cpu")` -> `get_device() if flag else torch.device("cpu")`."""
        choice = updated.args[0].value if isinstance(updated, cst.Call) else updated
        cpu = self._cpu_device()
        if device.cuda_first:
            return choice.with_changes(body=self._get_device_call(), orelse=cpu, lpar=updated.lpar, rpar=updated.rpar)
        return choice.with_changes(body=cpu, orelse=self._get_device_call(), lpar=updated.lpar, rpar=updated.rpar)

    def _cpu_device(self) -> cst.BaseExpression:
        torch_name = self._found.torch_alias
        if torch_name is None:
            self.add_import("torch")
            torch_name = "torch"
        return cst.parse_expression(f'{torch_name}.device("cpu")')

    def _get_device_call(self) -> cst.Call:
        if self._get_device_name == "get_device":
            self.add_import(RUNTIME_MODULE, "get_device")
        else:
            self.add_import(RUNTIME_MODULE, "get_device", asname=self._get_device_name)
        return cst.Call(func=cst.Name(self._get_device_name))

    def _string_uses(self, definition: Definition) -> Optional[list[Optional[str]]]:
        """How each read of a string device uses it (see `_use_kind`); None when
        the reads cannot be seen. It may become a torch.device only when it is
        passed on as a device somewhere, and elsewhere at most printed."""
        if not isinstance(definition.target, cst.Name):
            return None  # who reads `self.device` cannot be seen
        scope = self.get_metadata(ScopeProvider, definition.target, None)
        if scope is None or isinstance(scope, ClassScope):
            return None  # read as `Config.device`: cannot be seen either
        reads = [access.node for a in scope.assignments[definition.target.value] for access in a.references]
        return [self._use_kind(read) for read in reads]

    def _use_kind(self, node: cst.CSTNode) -> Optional[str]:
        """How a string device is read: "device" (`.to(d)`, `device=d`,
        `torch.device(d)`), "text" (printed, in an f-string), or None (anything
        else, where a torch.device would not behave like the string)."""
        parent = self.parent(node)
        if isinstance(parent, cst.FormattedStringExpression):
            return "text"
        if not isinstance(parent, cst.Arg) or parent.star:
            return None
        call = self.parent(parent)
        if not isinstance(call, cst.Call):
            return None
        if parent.keyword is not None:
            return "device" if parent.keyword.value in ("device", "map_location") else None
        if self.is_call_to(call, {"builtins.print"}):
            return "text"
        if self.is_call_to(call, TORCH_DEVICE) or (method_name(call) == "to" and call.args[0] is parent):
            return "device"
        return None

    def _is_device_assignment(self, assignment) -> bool:
        """Is this scope assignment a usable device definition (or a `device`
        parameter), or the CPU branch of an if/else that defines one?"""
        node = getattr(assignment, "node", None)
        if isinstance(node, cst.Param):
            return node.name.value == "device" and self._default_is_a_gpu(node)
        definition = self._definition_of.get(self._found.assignment_of.get(node))
        if definition is None or definition.target is not node:
            return False
        return definition.usable or (definition.cpu_branch and self._in_device_choice(definition))

    def _default_is_a_gpu(self, param: cst.Param) -> bool:
        """A `device` parameter with no default, or one that means the GPU:
        `.to(device)` then does what `.cuda()` did. `device=None` would make it
        a no-op, `device="cpu"` would move elsewhere."""
        if param.default is None:
            return True
        value = self._device_value(param.default)
        return value is not None and value.kind in (CUDA, RUNTIME)

    def _in_device_choice(self, definition: Definition) -> bool:
        """`definition` is a branch of an if/else that certainly binds its target
        to a usable device in some branch (`if gpu: d = cuda else: d = cpu`)."""
        line = self.parent(definition.statement)
        for ancestor in self.ancestors(line):
            if isinstance(ancestor, cst.If):
                top = ancestor
                while isinstance(self.parent(top), cst.If):  # an elif chain
                    top = self.parent(top)
                return self._device_target_of(top) is not None
            if not isinstance(ancestor, (cst.IndentedBlock, cst.Else)):
                return False
        return False

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
            return self._name_is_availability(test)
        return False

    def _name_is_availability(self, name: cst.Name) -> bool:
        scope = self.get_metadata(ScopeProvider, name, None)
        if scope is None:
            return False
        assignments = scope[name.value]
        if not assignments:
            return False
        for assignment in assignments:
            statement = self._found.assignment_of.get(getattr(assignment, "node", None))
            if statement is None or not self._is_availability(statement.value):
                return False
        return True

    # Where a site gets its device name.

    def _placement(self, site: cst.CSTNode) -> str:
        """The code of the device expression to use at `site`: an existing
        device variable in reach, else the module-level binding. "" when no
        name can be used safely there."""
        if self._gpu_choice is not None:
            return ""
        existing = self._existing_device(site)
        if not self._is_script:
            # A library follows only a device that its own code defines: a
            # parameter is the caller's, who may have meant another device.
            return existing if existing is not None and not self._names_a_parameter(existing, site) else ""
        if existing is not None:
            return existing
        name = self._binding_name
        if not name or not self._module_name_reaches(site, name):
            return ""
        self._needs_binding.add(site)
        return name

    def _existing_device(self, site: cst.CSTNode) -> Optional[str]:
        in_function = False
        child = site
        for ancestor in self.ancestors(site):
            class_body_seen_from_method = in_function and isinstance(self.parent(ancestor), cst.ClassDef)
            if isinstance(ancestor, (cst.IndentedBlock, cst.Module)) and not class_body_seen_from_method:
                found = self._defined_before(ancestor, child, in_function, site)
                if found is not None:
                    return found
            inside = isinstance(ancestor, (cst.FunctionDef, cst.Lambda)) and child is ancestor.body
            if inside and isinstance(ancestor, cst.FunctionDef):
                found = self._from_function(ancestor, site)
                if found is not None:
                    return found
            in_function = in_function or inside  # a parameter default runs outside
            child = ancestor
        return None

    def _from_function(self, function: cst.FunctionDef, site: cst.CSTNode) -> Optional[str]:
        """A `device` parameter, or `self.<name>` set in `__init__` of the class
        of this method."""
        for param in (*function.params.posonly_params, *function.params.params, *function.params.kwonly_params):
            if param.name.value == "device" and self._name_resolves_to_devices(site, "device"):
                return "device"
        return self._attribute_from_init(function)

    def _attribute_from_init(self, method: cst.FunctionDef) -> Optional[str]:
        owner = self.parent(self.parent(method))
        if not isinstance(owner, cst.ClassDef) or method.name.value == "__init__" or _is_static_or_class_method(method):
            return None
        self_name = _first_param(method)
        if self_name is None:
            return None
        for statement in owner.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__":
                init_self = _first_param(statement)
                for line in statement.body.body if isinstance(statement.body, cst.IndentedBlock) else ():
                    target = self._device_target_of(line)
                    if (
                        isinstance(target, cst.Attribute)
                        and isinstance(target.value, cst.Name)
                        and target.value.value == init_self
                    ):
                        return f"{self_name}.{target.attr.value}"
        return None

    def _defined_before(self, block, child, in_function: bool, site) -> Optional[str]:
        """A usable device definition that has run by the time `child` (a
        statement of `block`) runs."""
        body = list(block.body)
        position = next((i for i, s in enumerate(body) if s is child), None)
        if position is None:
            return None
        module_level_seen_from_function = isinstance(block, cst.Module) and in_function
        candidates = body if module_level_seen_from_function else body[:position]
        for statement in reversed(candidates):
            target = self._device_target_of(statement)
            if target is None:
                continue
            if isinstance(target, cst.Name):
                if self._name_resolves_to_devices(site, target.value):
                    return target.value
            elif not in_function or not isinstance(block, cst.Module):
                return code_of(target)
        return None

    def _device_target_of(self, statement: cst.CSTNode) -> Optional[cst.BaseExpression]:
        """The target that `statement` certainly binds to a usable device: an
        assignment, or an if/else that assigns the same target in every branch
        (the CPU in some of them, a usable device in at least one)."""
        found = self._branch_target(statement)
        return found[0] if found is not None and found[1] else None

    def _branch_target(self, statement: cst.CSTNode) -> Optional[tuple[cst.BaseExpression, bool]]:
        """(target, whether some branch binds a usable device, not the CPU)."""
        if isinstance(statement, cst.SimpleStatementLine):
            for small in reversed(statement.body):
                definition = self._definition_of.get(small)
                if definition is not None and (definition.usable or definition.cpu_branch):
                    return definition.target, definition.usable
            return None
        if isinstance(statement, cst.If) and statement.orelse is not None:
            first = self._block_branch_target(statement.body)
            other = statement.orelse
            second = self._branch_target(other) if isinstance(other, cst.If) else self._block_branch_target(other.body)
            if first is not None and second is not None and first[0].deep_equals(second[0]):
                return first[0], first[1] or second[1]
        return None

    def _block_branch_target(self, block: cst.BaseSuite) -> Optional[tuple[cst.BaseExpression, bool]]:
        if not isinstance(block, cst.IndentedBlock):
            return None
        for statement in reversed(block.body):
            found = self._branch_target(statement)
            if found is not None:
                return found
        return None

    def _name_resolves_to_devices(self, site: cst.CSTNode, name: str) -> bool:
        scope = self.get_metadata(ScopeProvider, site, None)
        if scope is None:
            return False
        assignments = scope[name]
        return bool(assignments) and all(self._is_device_assignment(a) for a in assignments)

    def _module_name_reaches(self, site: cst.CSTNode, name: str) -> bool:
        """Would `name` at `site` read the module-level binding? Not when a
        function around it binds the same name (even later: it is local)."""
        scope = self.get_metadata(ScopeProvider, site, None)
        if scope is None:
            return False
        return all(
            isinstance(a.scope, GlobalScope) and self._is_device_assignment(a) for a in scope[name]
        )

    def _report_unplaced(self, node: cst.CSTNode, subject: str, manual: str) -> None:
        """`node` is left alone because `_placement` found no device for it: say why."""
        if self._gpu_choice is not None:
            self.report(node, "AM313", f"{subject}: {self._gpu_choice_reason()}")
        elif not self._is_script:
            self.report(node, "AM311", f"{subject}: {LIBRARY_ADVICE}")
        else:
            self.report(node, "AM311", f"{subject}: {manual}")

    def _use_placement(self, site: cst.CSTNode, placement: str) -> cst.BaseExpression:
        """`site` is rewritten with `placement`: the node to put there."""
        if site in self._needs_binding:
            self._fallback_sites.append(site)
        return cst.parse_expression(placement)

    # Calls.

    def _move_kind(self, call: cst.Call) -> Optional[str]:
        """How this call hard-codes CUDA, if it does in a way we rewrite."""
        name = method_name(call)
        if name == "cuda" and not self.is_qualified(call.func, {"torch.cuda"}):
            return "cuda"
        if self.is_call_to(call, TORCH_DEVICE) and self._torch_device_value(call).kind == CUDA:
            return "torch.device" if not self._is_definition_value(call) else None
        if self.is_call_to(call, LEGACY_TYPES):
            return "legacy"
        return None

    def _is_definition_value(self, node: cst.CSTNode) -> bool:
        return node in self._definition_nodes

    def _plan_calls(self, calls: Sequence[cst.Call]) -> None:
        for call in calls:
            if self._inside_map_location_lambda(call) or self._expects_error(call):
                continue
            if self._in_parameter_default(call):
                self._report_in_default(call)
                continue
            kind = self._move_kind(call)
            if kind == "cuda":
                self._plan_cuda_method(call)
            elif kind == "torch.device":
                self._plan_torch_device(call)
            elif kind == "legacy":
                self._plan_legacy(call)
            else:
                self._plan_string_arguments(call)
            if self.is_call_to(call, TORCH_LOAD):
                self._plan_load(call)
            if self.is_call_to(call, NEEDS_GPU) and not self._under_cuda_check(call):
                self.report(call, "AM312", "this torch.cuda call fails without a GPU: run it only when `device.type == \"cuda\"`")
            if self.is_call_to(call, TORCH_DEVICE) and not self._is_definition_value(call):
                kind = self._torch_device_value(call).kind
                if kind == EXPLICIT_GPU:
                    self.report(call, "AM310", self._explicit_reason())
                elif kind == COMPUTED_GPU:
                    self.report(call, "AM313", COMPUTED_ADVICE)

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
            passed_in = self._is_parameter(index, defaulting_to_none=True) or (
                self._is_parameter(index) and "dev" in code_of(index).lower()
            )
            advice = PASSED_IN_ADVICE if passed_in else COMPUTED_ADVICE
            self.report(call, "AM313", f"`.cuda({code_of(index)})`: {advice}")
            return
        placement = self._placement(call)
        if not placement:
            self._report_unplaced(call, "`.cuda()`", f"no device name can be used here (`{self._binding_name or 'device'}` means something else in this scope); write `.to(<device>)` by hand")
            return
        receiver = call.func.value
        if self._is_redundant_move(call, receiver, kept):
            if self.fix(call, "AM305", "removed a second device move: the value is already on the device"):
                self._edits[call] = lambda updated: updated.func.value.with_changes(
                    lpar=updated.lpar or updated.func.value.lpar, rpar=updated.rpar or updated.func.value.rpar
                )
            return
        if isinstance(receiver, cst.Call) and method_name(receiver) == "cpu" and not receiver.args:
            self.report(call, "AM306", "`.cpu().cuda()` copies to the host and back: drop `.cpu()` if no copy is needed (or write `.clone()`)")
        if self.fix(call, "AM301", f"`.cuda()` -> `.to({placement})`"):
            expression = self._use_placement(call, placement)
            self._edits[call] = lambda updated: _to_call(updated, expression)

    def _is_redundant_move(self, call: cst.Call, receiver: cst.BaseExpression, kept: list[cst.Arg]) -> bool:
        """`x.cuda().cuda()`: the outer move of a value that the inner one just
        moved (and rewrites) does nothing."""
        if any(arg.keyword is not None and arg.keyword.value == "memory_format" for arg in kept):
            return False
        return isinstance(receiver, cst.Call) and self._move_kind(receiver) == "cuda" and self._will_rewrite(receiver)

    def _will_rewrite(self, call: cst.Call) -> bool:
        return call in self._edits

    def _plan_torch_device(self, call: cst.Call) -> None:
        """`torch.device("cuda")` (not a definition) -> device."""
        placement = self._placement(call)
        if not placement:
            self._report_unplaced(call, "`torch.device(\"cuda\")`", "no device name can be used here; replace it by hand")
            return
        if self.fix(call, "AM302", f"`torch.device(\"cuda\")` -> `{placement}`"):
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
            self._edits[call] = lambda updated: _legacy_to_cpu(updated, expression)

    def _plan_string_arguments(self, call: cst.Call) -> None:
        """"cuda" passed where torch expects a device: `.to("cuda")`,
        `torch.zeros(..., device="cuda")`, `torch.set_default_device("cuda")`."""
        if self._takes_string_device(call):
            return  # torch.autocast("cuda"), GradScaler(device="cuda"): the amp codemod's concern
        default = keyword_arg(call, "default")
        if method_name(call) == "add_argument" and default is not None and cuda_literal(default.value) is not None:
            self.report(default.value, "AM302", "command-line device defaulting to \"cuda\": make the default None and use `torch.device(args.device) if args.device else get_device()`")
            return
        for arg in self._device_string_arguments(call):
            if self._is_explicit(arg.value):
                self.report(arg.value, "AM310", self._explicit_reason())
                continue
            if self._string_gpu(arg.value) == COMPUTED_GPU:
                self.report(arg.value, "AM313", COMPUTED_ADVICE)
                continue
            if not self._takes_torch_device(call, arg):
                self.report(arg.value, "AM302", "\"cuda\" passed to a function that is not torch's: pass the runtime's device (get_device()) by hand if it takes a torch.device")
                continue
            placement = self._placement(arg.value)
            if not placement:
                self._report_unplaced(arg.value, "\"cuda\"", "no device name can be used here; replace it by hand")
                continue
            if self.fix(arg.value, "AM302", f"hard-coded \"cuda\" -> `{placement}`"):
                expression = self._use_placement(arg.value, placement)
                self._edits[arg.value] = lambda updated, e=expression: e

    def _device_string_arguments(self, call: cst.Call) -> Iterable[cst.Arg]:
        """Arguments that name a CUDA device as a string and that we look at."""
        if self.is_call_to(call, TORCH_DEVICE) or self._is_definition_value(call):
            return  # torch.device(...) is handled whole
        for position, arg in enumerate(call.args):
            if cuda_literal(arg.value) is None:
                continue
            if arg.keyword is not None and arg.keyword.value in ("device", "map_location"):
                yield arg
            elif arg.keyword is None and position == 0 and (
                method_name(call) == "to" or self.is_call_to(call, SET_DEFAULT_DEVICE)
            ):
                yield arg

    def _takes_string_device(self, call: cst.Call) -> bool:
        return any(name.startswith(STRING_DEVICE_APIS) for name in self.qualified_names(call.func))

    def _takes_torch_device(self, call: cst.Call, arg: cst.Arg) -> bool:
        if arg.keyword is not None and arg.keyword.value == "map_location":
            return self.is_call_to(call, TORCH_LOAD)
        if method_name(call) in DEVICE_METHODS:
            return True  # a tensor's or a module's method
        names = self.qualified_names(call.func)
        return any(n.startswith("torch.") for n in names)

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
        computes_on_cpu = self._is_script and self._gpu_choice is None and not self._places_on_device()
        placement = '"cpu"' if computes_on_cpu else self._placement(call)
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
            or any(self._move_kind(c) is not None or any(True for _ in self._device_string_arguments(c)) for c in self._found.calls)
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
            if isinstance(ancestor, (cst.If, cst.IfExp)) and child is not ancestor.test and _mentions_cuda(ancestor.test):
                return True
            child = ancestor
        return False

    def _plan_parameter_defaults(self, parameters: Sequence[cst.Param]) -> None:
        """`def train(model, device="cuda")`: a default is evaluated where the
        function is defined, at import, so it is never rewritten to the
        run-time device; reported when the function passes it on as a device."""
        for param in parameters:
            if cuda_literal(param.default) is None:
                continue
            if self._is_explicit(param.default):
                self.report(param.default, "AM310", self._explicit_reason())
                continue
            verdict = _string_verdict(self._parameter_uses(param), param.name.value)
            if verdict == "report":
                self.report(param.default, "AM302", STRING_DEVICE_ADVICE)
            elif verdict == "rewrite":
                self.report(param.default, "AM302", DEFAULT_ADVICE)

    def _parameter_uses(self, param: cst.Param) -> Optional[list[Optional[str]]]:
        function = self.parent(self.parent(param))
        body = getattr(function, "body", None)
        scope = self.get_metadata(ScopeProvider, body, None) if body is not None else None
        if scope is None:
            return None
        if isinstance(function, cst.FunctionDef) and isinstance(body, cst.IndentedBlock) and body.body:
            scope = self.get_metadata(ScopeProvider, body.body[0], scope)
        reads = [
            access.node
            for assignment in scope.assignments[param.name.value]
            if getattr(assignment, "node", None) is param
            for access in assignment.references
        ]
        return [self._use_kind(read) for read in reads]

    # Guards made useless by the runtime's device.

    def _plan_guards(self, ifs: Sequence[cst.If], conditionals: Sequence[cst.IfExp]) -> None:
        for statement in ifs:
            if self._is_removable_guard(statement):
                if self.fix(statement, "AM309", "`if torch.cuda.is_available():` around device moves removed: `.to(device)` is a no-op on the CPU"):
                    self._unwrapped.add(statement)
        for conditional in conditionals:
            if self._is_removable_conditional(conditional):
                if self.fix(conditional, "AM309", "`x.cuda() if <CUDA available> else x` -> `x.to(device)`"):
                    self._edits[conditional] = lambda updated: updated.body.with_changes(lpar=updated.lpar, rpar=updated.rpar)

    def _is_removable_guard(self, statement: cst.If) -> bool:
        if statement.orelse is not None or not self._is_availability(statement.test):
            return False
        block = statement.body
        if isinstance(block, cst.IndentedBlock):
            if block.header.comment is not None or block.footer:
                return False
            lines = block.body
        else:
            lines = [statement]  # `if c: x = x.cuda()` on one line
            if block.trailing_whitespace.comment is not None:
                return False
        smalls = []
        for line in lines:
            if line is statement:
                smalls.extend(block.body)
            elif isinstance(line, cst.SimpleStatementLine):
                smalls.extend(line.body)
            else:
                return False
        return bool(smalls) and all(self._is_move_statement(small) for small in smalls)

    def _is_move_statement(self, small: cst.BaseSmallStatement) -> bool:
        """`model.cuda()`, `x = x.cuda()`, `x, y = x.cuda(), y.cuda()` (all rewritten)."""
        if isinstance(small, cst.Expr):
            return self._is_planned_move_of(small.value, None)
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target, value = small.targets[0].target, small.value
            if isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple) and len(target.elements) == len(value.elements):
                return all(self._is_planned_move_of(v.value, t.value) for t, v in zip(target.elements, value.elements))
            return self._is_planned_move_of(value, target)
        return False

    def _is_planned_move_of(self, value: cst.BaseExpression, target: Optional[cst.BaseExpression]) -> bool:
        if not isinstance(value, cst.Call) or value not in self._edits or self._move_kind(value) != "cuda":
            return False
        receiver = value.func.value
        while isinstance(receiver, cst.Call) and receiver in self._edits and self._move_kind(receiver) == "cuda":
            receiver = receiver.func.value
        return target is None or receiver.deep_equals(target)

    def _is_removable_conditional(self, node: cst.IfExp) -> bool:
        return self._is_availability(node.test) and self._is_planned_move_of(node.body, node.orelse)

    # torch.cuda.set_device.

    def _plan_set_device(self, calls: Sequence[cst.Call]) -> None:
        for call in calls:
            if call is self._gpu_choice and self.is_call_to(call, CUDA_DEVICE_CONTEXT):
                self.report(call, "AM313", f"{code_of(call.func)}(...): {self._gpu_choice_reason()}")
            if not self.is_call_to(call, SET_DEVICE) or self._expects_error(call):
                continue
            if call.args and self._is_explicit(call.args[0].value):
                self.report(call, "AM310", f"torch.cuda.set_device({code_of(call.args[0].value)}): {self._explicit_reason()}")
                continue
            if call.args and self._index_kind(call.args[0].value, call) == COMPUTED_GPU or self._gpu_choice is not None:
                self.report(call, "AM313", f"torch.cuda.set_device({code_of(call.args[0].value) if call.args else ''}): {self._gpu_choice_reason()}")
                continue
            statement = self._statement_of_call(call)
            if statement is None or not (self._uses_runtime or self._fallback_sites or self._calls_runtime_already()):
                self.report(call, "AM307", "torch.cuda.set_device(...): remove it once `device = get_device()` chooses the GPU (it sets the current device to cuda:<local rank>); select GPUs with CUDA_VISIBLE_DEVICES")
                continue
            if self.fix(call, "AM307", "torch.cuda.set_device(...) removed: get_device() sets the current device to cuda:<local rank>; select GPUs with CUDA_VISIBLE_DEVICES"):
                self._dropped.add(self._removable_guard_of(statement) or statement)

    def _calls_runtime_already(self) -> bool:
        return any(d.device.kind == RUNTIME for d in self._definitions)

    def _statement_of_call(self, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
        expression = self.parent(call)
        line = self.parent(expression) if isinstance(expression, cst.Expr) else None
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return line
        return None

    def _removable_guard_of(self, line: cst.SimpleStatementLine) -> Optional[cst.If]:
        """`if args.gpu is not None:` whose only statement is `line` goes with it."""
        block = self.parent(line)
        guard = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if (
            isinstance(guard, cst.If)
            and guard.orelse is None
            and len(block.body) == 1
            and not any(empty.comment for empty in line.leading_lines)
            and not block.footer
            and block.header.comment is None
            and _has_no_side_effects(guard.test)
            and isinstance(self.parent(guard), (cst.IndentedBlock, cst.Module))
        ):
            return guard
        return None

    # Reports without a rewrite.

    def _report_legacy_references(self, references: Sequence[cst.CSTNode]) -> None:
        for node in references:
            if self.is_qualified(node, LEGACY_TYPES):
                self.report(node, "AM308", "legacy CUDA tensor type used as a value: create tensors with `device=device` (e.g. `torch.ones(n, 1, device=device)`) or `.to(device)`; `x.type(torch.cuda.FloatTensor)` -> `x.to(device, torch.float32)`")

    # The module-level binding.

    def _plan_binding(self) -> None:
        if not self._fallback_sites:
            return
        self._uses_runtime = True
        self._get_device_call()  # schedules the import
        first = min(self._top_level_index(site) for site in self._fallback_sites)
        anchor = None
        for statement in self._module.body[:first]:
            if _is_import_line(statement):
                anchor = statement
        if anchor is None:
            self._binding_at_top = True
        else:
            self._anchor = anchor

    def _top_level_index(self, node: cst.CSTNode) -> int:
        top = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.Module):
                break
            top = ancestor
        return next(i for i, statement in enumerate(self._module.body) if statement is top)

    def _binding_line(self) -> cst.SimpleStatementLine:
        return cst.SimpleStatementLine(
            body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(self._binding_name))], value=cst.Call(func=cst.Name(self._get_device_name)))],
            leading_lines=[cst.EmptyLine()],
        )

    # -- rewriting --------------------------------------------------------------------------

    def on_leave(self, original_node, updated_node):
        updated_node = super().on_leave(original_node, updated_node)
        edit = self._edits.get(original_node)
        if edit is not None:
            return edit(updated_node)
        return updated_node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._rewrite_body(original_node.body, updated_node.body)
        return updated_node if body is None else updated_node.with_changes(body=body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._rewrite_body(original_node.body, updated_node.body)
        body = list(updated_node.body if body is None else body)
        if self._binding_at_top:
            body.insert(_after_docstring_and_future(body), self._binding_line())
        return updated_node.with_changes(body=body)

    def _rewrite_body(self, originals, updated) -> Optional[list]:
        """Drop, unwrap and insert statements of one body (matched by the
        original nodes); None when nothing in it changes."""
        touched = self._dropped | self._unwrapped | ({self._anchor} if self._anchor is not None else set())
        if touched.isdisjoint(originals):
            return None
        result: list = []
        carried: list[cst.EmptyLine] = []  # comments above a dropped statement
        for old, new in zip(originals, updated):
            if old in self._dropped:
                carried.extend(new.leading_lines)
                continue
            pieces = _unwrap(new) if old in self._unwrapped else [new]
            if carried:
                pieces[0] = pieces[0].with_changes(leading_lines=[*carried, *pieces[0].leading_lines])
                carried = []
            result.extend(pieces)
            if old is self._anchor:
                result.append(self._binding_line())
        if not result or any(line.comment for line in carried):
            result.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried))
        return result


# -- collecting candidates ------------------------------------------------------------------


class _Collector(cst.CSTVisitor):
    """One pass over the original tree: everything the planner looks at."""

    def __init__(self) -> None:
        self.calls: list[cst.Call] = []
        self.assignments: list[tuple[cst.CSTNode, cst.BaseSmallStatement]] = []
        self.assignment_of: dict[cst.CSTNode, cst.BaseSmallStatement] = {}  # target Name -> statement
        self.ifs: list[cst.If] = []
        self.conditionals: list[cst.IfExp] = []
        self.legacy_references: list[cst.CSTNode] = []
        self.parameters: list[cst.Param] = []  # with a default
        self.all_names: set[str] = set()
        self.torch_alias: Optional[str] = None
        self._callee: set[cst.CSTNode] = set()

    def visit_Call(self, node: cst.Call) -> None:
        self._callee.add(node.func)

    def leave_Call(self, original_node: cst.Call) -> None:
        self.calls.append(original_node)  # inner calls first: `x.cuda().cuda()`

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0].target, (cst.Name, cst.Attribute)):
            self._record(node.targets[0].target, node)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None and isinstance(node.target, (cst.Name, cst.Attribute)):
            self._record(node.target, node)

    def _record(self, target, statement) -> None:
        self.assignments.append((target, statement))
        self.assignment_of[target] = statement

    def visit_If(self, node: cst.If) -> None:
        self.ifs.append(node)

    def visit_Param(self, node: cst.Param) -> None:
        if node.default is not None:
            self.parameters.append(node)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self.conditionals.append(node)

    def visit_Name(self, node: cst.Name) -> None:
        self.all_names.add(node.value)
        if node.value.endswith("Tensor") and node not in self._callee:
            self.legacy_references.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if node.attr.value.endswith("Tensor") and node not in self._callee:
            self.legacy_references.append(node)
        return True

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False  # `from torch.cuda import FloatTensor` is not a use

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            if code_of(alias.name) == "torch" and self.torch_alias is None:
                self.torch_alias = alias.asname.name.value if alias.asname else "torch"


# -- small syntax helpers -----------------------------------------------------------------


def _equal() -> cst.AssignEqual:
    return cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def cuda_arguments(call: cst.Call) -> tuple[list[cst.Arg], Optional[cst.BaseExpression]]:
    """The arguments of `.cuda(...)` that `.to(device, ...)` keeps, as keywords
    (`non_blocking`, `memory_format`), and the device argument if given."""
    kept: list[cst.Arg] = []
    device = None
    for position, arg in enumerate(call.args):
        name = arg.keyword.value if arg.keyword is not None else ("device", "non_blocking")[min(position, 1)]
        if name == "device":
            device = arg.value
        elif arg.keyword is None:
            kept.append(arg.with_changes(keyword=cst.Name(name), equal=_equal()))
        else:
            kept.append(arg)
    return kept, device


def _to_call(updated: cst.Call, device: cst.BaseExpression) -> cst.Call:
    """`x.cuda(<args>)` -> `x.to(device, <kept args>)`."""
    kept, _ = cuda_arguments(updated)
    first = cst.Arg(value=device, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if kept else cst.MaybeSentinel.DEFAULT)
    if kept:
        last = kept[-1]
        kept = [arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for arg in kept[:-1]] + [
            last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        ]
    func = updated.func.with_changes(attr=cst.Name("to"))
    return updated.with_changes(func=func, args=[first, *kept])


def _legacy_to_cpu(updated: cst.Call, device: cst.BaseExpression) -> cst.Call:
    """`torch.cuda.FloatTensor(...)` -> `torch.FloatTensor(...).to(device)`."""
    cpu_type = updated.func.with_changes(value=updated.func.value.value)
    constructor = updated.with_changes(func=cpu_type, lpar=[], rpar=[])
    return cst.Call(
        func=cst.Attribute(value=constructor, attr=cst.Name("to")),
        args=[cst.Arg(device)],
        lpar=updated.lpar,
        rpar=updated.rpar,
    )


def _unwrap(statement: cst.If) -> list[cst.BaseStatement]:
    """The statements of an `if` body, standing in for the `if`."""
    body = statement.body
    if isinstance(body, cst.IndentedBlock):
        lines = list(body.body)
    else:
        lines = [cst.SimpleStatementLine(body=body.body, trailing_whitespace=body.trailing_whitespace)]
    lines[0] = lines[0].with_changes(leading_lines=[*statement.leading_lines, *lines[0].leading_lines])
    return lines


def _string_verdict(uses: Optional[Sequence[Optional[str]]], name: str) -> str:
    """What to do with a string "cuda" bound to `name` and read as `uses`:
    "rewrite" it to the runtime's device when it is passed on as a device and
    otherwise at most printed; "skip" a string never used as a device whose
    name does not say device; "report" the rest."""
    if uses is not None and None not in uses and "device" in uses:
        return "rewrite"
    if uses is not None and "device" not in uses and "dev" not in name.lower():
        return "skip"
    return "report"


def _last_name(target: cst.BaseExpression) -> str:
    """`device` -> "device", `self.device` -> "device"."""
    return target.attr.value if isinstance(target, cst.Attribute) else getattr(target, "value", "")


def _first_param(function: cst.FunctionDef) -> Optional[str]:
    params = [*function.params.posonly_params, *function.params.params]
    return params[0].name.value if params else None


def _is_static_or_class_method(function: cst.FunctionDef) -> bool:
    return any(
        isinstance(decorator.decorator, cst.Name) and decorator.decorator.value in ("staticmethod", "classmethod")
        for decorator in function.decorators
    )


def _is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def _after_docstring_and_future(body: Sequence[cst.CSTNode]) -> int:
    index = 0
    if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr) and isinstance(body[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
        index = 1
    while index < len(body) and isinstance(body[index], cst.SimpleStatementLine) and any(
        isinstance(small, cst.ImportFrom) and small.module is not None and code_of(small.module) == "__future__"
        for small in body[index].body
    ):
        index += 1
    return index


def _all_nodes(trees: Iterable[cst.CSTNode]) -> set[cst.CSTNode]:
    finder = _Everything()
    for tree in trees:
        tree.visit(finder)
    return finder.nodes


class _Everything(cst.CSTVisitor):
    def __init__(self) -> None:
        self.nodes: set[cst.CSTNode] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.add(node)
        return True


def _mentions_cuda(test: cst.CSTNode) -> bool:
    """Does an `if` test look at CUDA (a name, attribute or string with "cuda",
    `.is_cuda`, `.type`)?"""
    finder = _CudaMention()
    test.visit(finder)
    return finder.found


class _CudaMention(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found = False

    def visit_Name(self, node: cst.Name) -> None:
        if "cuda" in node.value.lower() or node.value in ("type", "device_count"):
            self.found = True

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if "cuda" in node.value:
            self.found = True


def _has_no_side_effects(test: cst.CSTNode) -> bool:
    """Names, attributes, constants, comparisons and boolean operators only."""
    if isinstance(test, (cst.Name, cst.Integer, cst.SimpleString)):
        return True
    if isinstance(test, cst.Attribute):
        return _has_no_side_effects(test.value)
    if isinstance(test, cst.Comparison):
        return _has_no_side_effects(test.left) and all(_has_no_side_effects(c.comparator) for c in test.comparisons)
    if isinstance(test, cst.BooleanOperation):
        return _has_no_side_effects(test.left) and _has_no_side_effects(test.right)
    if isinstance(test, cst.UnaryOperation):
        return _has_no_side_effects(test.expression)
    return False
