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
    - `x.to(0)`, `torch.device(0)`, `device=0` given to torch: a GPU ordinal
      is a placement too -> `device`; `self.device = device or
      torch.device("cuda" ...)` -> `device or get_device()` (the passed-in
      device stays the caller's);
    - `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor` (`cuda`
      being CUDA's availability) -> `Tensor = tensor_type(torch.float32,
      device)` (accelmigrate.runtime.legacy: the same CPU or CUDA type there,
      a constructor onto the device elsewhere), when every read of the name
      calls it or gives it to `.type()`; `x.type(Tensor)` and
      `x.type(torch.cuda.FloatTensor)` -> `x.to(device, torch.float32)`;
    - `torch.cuda.set_device(i)` runs only under `if torch.cuda.is_available():`,
      so on a GPU it still selects the process's GPU before NCCL starts;
    - `init_process_group("nccl")` and a `--dist-backend` flag defaulting to
      "nccl" -> `default_backend()` (accelmigrate.runtime.backend): nccl where
      the script computes on CUDA, gloo elsewhere;
    - a GPU index known only at run time (`.cuda(rank)` in an `mp.spawn`
      worker, `.cuda(self.rank)`, `.cuda(i)` in a loop over GPUs,
      `torch.device("cuda", i)`, `f"cuda:{i}"`, a `--gpu` flag) ->
      `device_at(i)`: GPU i wherever CUDA is available, the runtime's device
      elsewhere, so each process keeps its GPU and never collapses onto
      another's. In a file that selects its GPU (`torch.cuda.set_device(rank)`,
      `with torch.cuda.device(i):`), plain "cuda" means that GPU:
      `device_at()`, the current GPU. A function whose placements all name its
      own index parameter binds `device = device_at(rank)` once at its top;
      one whose index is a local bound once (`local_rank = setup()`), or a
      flat script's `args.gpu` that nothing assigns again, binds it right
      after that assignment;
    - `DistributedDataParallel(model, device_ids=[i], output_device=i)` ->
      `device_ids=ddp_device_ids(model)`: the model's GPU, None on the CPU
      (which refuses GPU device_ids); `output_device` defaults to it. For a
      module moved in the call itself (`DDP(net.cuda(i), device_ids=[i])`):
      `device_ids=device_ids_for(device_at(i))`, the GPU it was moved to;
    - a string device (`"cuda" if ... else "cpu"`) that is only passed on as
      a device, also through a parameter of a function of the file that only
      places with it (`train(model, device)`), -> `get_device()`;
    - an apex import behind `try: ... except ImportError: raise` whose names
      nothing reads is removed: it only made the script refuse to run without
      apex. (`from apex import amp` in use is the `amp` codemod's.)
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

    Only a file that runs as a script chooses the device: one with a
    training loop (`loss.backward()` in a loop that also calls
    `optimizer.step()`), work done at import (a flat script: CUDA placements,
    `torch.load`, `parser.parse_args()`), or placements in functions that its
    main guard runs (calls, or passes on by name: `mp.spawn(main)`).
    A library module (models, helpers, a test suite's utilities) gets no
    module-level `device = get_device()`, which would choose and set the GPU
    when it is imported, and its device definitions are kept: there a
    placement follows only a device variable that the module itself defines
    (not a parameter, which is the caller's). Else, in a module that a
    script of the run imports (`apply train.py` takes in the modules it
    reaches), plain "cuda" becomes `device_at()`, which chooses and sets
    nothing: with CUDA the current GPU, as `.cuda()` meant (the one the
    script made current), the runtime's device without; the same for a
    GPU index there (`device_at(i)`). A library on its own reports them,
    and any library a `torch.load` with no device of its own, whose
    checkpoint loads where it was saved (AM311, AM303). So does a library
    whose main guard only runs a benchmark or a self-test of it (it declares
    `__all__`, or the guard runs none of its functions that place on a
    device, as `unittest.main()`): there the guard's own placements use
    `device = get_device()` bound (and imported) at the top of the guard, so
    that importing the module still chooses nothing.

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
    - `.cuda(device)` of a passed-in device that may be None (`.to(None)`
      moves nothing), and a computed GPU index in a library module (AM313);
    - a parameter default (`def f(device="cuda")`): it is evaluated at
      import, so it never refers to the run-time device (AM302);
    - `x.cpu().cuda()`: a copy to the host and back, rewritten to
      `x.cpu().to(device)` so the copy is kept, and reported (AM306);
    - calls that need a GPU to run (`torch.cuda.synchronize()`,
      `torch.cuda.Event`...) outside a CUDA check (AM312);
    - a place where no device name can be used safely (it is assigned only
      later in the function, or every candidate name is taken), `.cuda(*args)`
      and `torch.Tensor.cuda(x)` (AM311);
    - a string device (`device = "cuda"`) used as text other than printed,
      compared otherwise than with a bare type name, or read where its uses
      cannot be seen (`Config.device`, a `self.device` that an instance's
      `trainer.device` reads outside its class):
      `torch.device("cuda:0") == "cuda"` is False (AM303, AM302). One that is
      compared with a type name (`device == "cuda"`, `"cuda" in device`, and
      `self.device == "cuda"` in the methods of a class that binds it once)
      becomes `get_device()` and the comparison reads `device.type`, which
      holds that name; a string that merely says "cuda" or holds a type name
      (`device_type = "cuda" if "cuda" in device else "cpu"`, autocast's
      `device_type=`) and is never used as a device is not touched;
    - `parser.add_argument("--device", default="cuda")` (AM302, unfixed);
    - legacy CUDA tensor types used as other values: chosen by a user's flag
      (`if opt.cuda`), or the chosen type passed on or used in `isinstance`
      (AM308);
    - `torch.cuda.set_device(...)` on a line with other statements (AM307);
      a DDP `device_ids` list of another shape, or `output_device` different
      from it (AM316);
    - an apex name in use other than apex amp (`apex.parallel`,
      `apex.optimizers`): the replacement is named (AM315).
    - `"cuda"` given to a function that is not torch's (AM302, unfixed);
      `device_type="cuda"`, `torch.autocast("cuda")` and
      `GradScaler(device="cuda")`, which take the string by contract (the
      `amp` codemod's concern), without a finding;
    - code inside `with self.assertRaises(...):` or `with pytest.raises(...):`,
      which a test expects to fail, without a finding.
"""

from __future__ import annotations

from typing import Callable, Optional

import libcst as cst

from ._base import Codemod, remove_statements, walk
from ._device.calls import CallPlans
from ._device.comparisons import StringComparisons
from ._device.guards import GuardPlans
from ._device.literals import (
    BINDING_NAMES, COMPUTED_GPU, CUDA, EXPECTS_ERROR_FUNCTIONS, EXPECTS_ERROR_METHODS, GET_DEVICE, GET_DEVICE_NAMES, LIBRARY,
    LIBRARY_ADVICE, OTHER_GPU, RUNTIME_MODULE, SCRIPT, SELF_TEST, SELF_TEST_ADVICE, SET_DEFAULT_DEVICE, TORCH_DEVICE,
    TORCH_LOAD, cuda_literal, method_name,
)
from ._device.apex import ApexPlans
from ._device.backend import BackendPlans
from ._device.legacy import LegacyTypePlans
from ._device.per_process import PerProcessPlans
from ._device.placement import Placement
from ._syntax import in_place_of
from ._device.syntax import after_docstring_and_future, binding_line, is_import_line, runtime_import_line, unwrap
from ._device.values import DeviceValues
from .script.device_facts import device_facts

Edit = Callable[[cst.CSTNode], cst.CSTNode]


class Device(DeviceValues, StringComparisons, Placement, CallPlans, PerProcessPlans, BackendPlans, GuardPlans, LegacyTypePlans, ApexPlans, Codemod):
    word = "device"
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    summary = "hard-coded .cuda() / 'cuda' placements -> one device chosen at run time (get_device())"
    codes = {
        "AM301": ".cuda() ties the script to a CUDA GPU",
        "AM302": "hard-coded CUDA device ('cuda', torch.device('cuda'), a GPU ordinal)",
        "AM303": "CUDA device definition that bypasses the run-time device choice",
        "AM304": "torch.load without map_location: a checkpoint saved on a GPU fails to load on a CPU",
        "AM305": "redundant second device move",
        "AM306": ".cpu().cuda(): a round trip through the host",
        "AM307": "torch.cuda.set_device(...) that fails without CUDA",
        "AM308": "legacy CUDA tensor type (torch.cuda.FloatTensor...)",
        "AM309": "CUDA availability check around device moves that .to(device) makes unneeded",
        "AM310": "explicit GPU other than 0",
        "AM311": "CUDA placement with no device name in reach",
        "AM312": "call that needs a GPU to run, outside a CUDA check",
        "AM313": "GPU index computed at run time (a rank, a loop variable, a passed-in device)",
        "AM314": "process-group backend hard-coded to NCCL, which needs a GPU",
        "AM315": "NVIDIA apex required at import",
        "AM316": "DistributedDataParallel given GPU device_ids, which a model on the CPU refuses",
    }
    # Every match contains "cuda" (`.cuda(`, "cuda" strings, `torch.cuda.`,
    # `from torch import cuda`), "load" (`torch.load`, `from torch import load`),
    # "nccl" (a backend) or "apex" (its import).
    triggers = ("cuda", "load", "nccl", "apex")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._edits: dict[cst.CSTNode, Edit] = {}
        self._unwrapped: set[cst.If] = set()  # ifs replaced by their body
        self._removed: set[cst.CSTNode] = set()  # statements removed
        self._anchor: Optional[cst.CSTNode] = None  # the binding goes after it
        self._binding_at_top = False
        self._binding_name = "device"
        self._get_device_name = "get_device"
        self._uses_runtime = False
        self._device_at_sites: dict[cst.CSTNode, str] = {}  # may be placed with device_at(<index code>)
        self._placed_at: list[cst.CSTNode] = []  # placed with device_at()
        self._device_bound_in: dict[cst.CSTNode, str] = {}  # functions (or the module) that bind `device = device_at(...)`
        self._bind_after: dict[cst.CSTNode, str] = {}  # statement -> the `device = device_at(...)` line that follows it
        self._import_in_guard = False  # SELF_TEST: `from ... import get_device` at the top of the guard
        self._several_gpus = False  # the file names a GPU other than 0
        self._followed_params: set[cst.Param] = set()  # parameters whose reads are being classified

    # -- planning ---------------------------------------------------------------------------

    def visit_Module(self, node: cst.Module) -> bool:
        self._module = node
        self.facts = device_facts(self.script)
        calls = self.facts.calls
        self._choose_get_device_name()
        self._several_gpus = any(self._names_other_gpu(call) for call in calls) or any(
            cuda_literal(statement.value) == OTHER_GPU for _, statement in self.facts.assignments
        )
        self._local_rank_flag = any(self._declares_local_rank_flag(call) for call in calls)
        self._definitions = self._read_definitions()
        self._definition_nodes = {n for d in self._definitions for n in walk(d.value)}
        self._role = self._file_role(calls)
        self._gpu_choice = self._file_chooses_its_gpu(calls)
        self._fallback_sites: list[cst.CSTNode] = []  # rewritten with the added binding
        self._needs_binding: set[cst.CSTNode] = set()
        self._plan_definitions()
        self._choose_binding_name()
        self._needs_binding.clear()
        self._plan_calls()
        for call in self.facts.calls:
            self._plan_ddp_device_ids(call)
        self._plan_parameter_defaults()
        self._plan_guards()
        self._plan_set_device()
        self._plan_backend_assignments()
        self._plan_legacy_values()
        self._plan_apex_imports()
        self._plan_device_bindings()
        self._plan_binding()
        return True

    # Which names: the runtime's function and the added binding.

    def _choose_get_device_name(self) -> None:
        taken = any(
            ({b.qualified} if b.kind == "import" else {b.name}).isdisjoint(GET_DEVICE)
            for b in self.script.module_scope.bindings.get("get_device", ())
        )
        self._get_device_name = GET_DEVICE_NAMES[1] if taken else GET_DEVICE_NAMES[0]

    def _choose_binding_name(self) -> None:
        """`device`, unless that name means something else where it is needed."""
        for name in BINDING_NAMES:
            if name != "device" and name in self.facts.all_names:
                continue
            if self._binding_name_fits(name):
                self._binding_name = name
                return
        self._binding_name = ""  # nothing fits: every site that needs it is reported

    def _binding_name_fits(self, name: str) -> bool:
        self._binding_name = name
        if not all(self._is_device_binding(b) for b in self.script.module_scope.bindings.get(name, ())):
            return False
        if self._read_unbound(name):
            return False  # a module-level binding would give that read a meaning it never had
        return not any(
            self._needs_device(call) and self._chooses_device(call) and self._placement(call) == "" for call in self.facts.calls
        )

    def _read_unbound(self, name: str) -> bool:
        """`name` is read somewhere that no binding in the file reaches."""
        index = self.script.index
        return any(
            self.facts.uses.is_read(node) and index.home_of(name, index.scope_of(node)) is None
            for node in self.facts.uses.names.get(name, ())
        )

    # Library modules, and code that runs at import or expects an error.

    def _file_role(self, calls) -> str:
        """SCRIPT: the file runs as a script (a training loop, CUDA work done at
        import, or device work in module-level code or in functions that its
        main guard runs): it chooses the device, bound once at module level. SELF_TEST: a library
        whose main guard only runs a benchmark or a self-test of it (it
        declares `__all__`, or no function with device work runs from the
        guard): only the guard's own code chooses the device, bound inside the
        guard, so that importing the module chooses nothing. LIBRARY: the rest;
        its callers choose the device."""
        if self._has_training_loop() or any(self._works_at_import(call) for call in calls):
            return SCRIPT
        guard = self.script.entry.main_guard
        if guard is None:
            return LIBRARY
        if not self.facts.declares_all and any(
            not self._in_main_guard(node) and self.facts.runs_from_entry(node) for node in self._device_work(calls)
        ):
            return SCRIPT  # flat code, or functions that the main guard runs
        return SELF_TEST if isinstance(guard.body, cst.IndentedBlock) else LIBRARY

    def _works_at_import(self, call: cst.Call) -> bool:
        """CUDA work, a checkpoint loaded or a command line read when the module is imported."""
        return (
            self._uses_cuda_at_import(call)
            or (self.is_call_to(call, TORCH_LOAD) and self._runs_at_import(call))
            or (method_name(call) == "parse_args" and self._runs_at_import(call))
        )

    def _device_work(self, calls):
        """The placements and CUDA device definitions of the file."""
        yield from (call for call in calls if self._needs_device(call))
        yield from (
            call for call in calls if self.is_call_to(call, TORCH_DEVICE) and self._torch_device_value(call).kind == COMPUTED_GPU
        )
        yield from (d.value for d in self._definitions if d.device.kind in (CUDA, COMPUTED_GPU, "choice"))

    def _chooses_device(self, node: cst.CSTNode) -> bool:
        """May the code at `node` choose the device (the script's), rather than
        follow its caller's (a library's)?"""
        if self._role == SELF_TEST:
            return self.script.function_at(node) is None and self._in_main_guard(node)
        return self._role == SCRIPT

    def _in_main_guard(self, node: cst.CSTNode) -> bool:
        return self.script.entry.main_guard in self.ancestors(node)

    def _has_training_loop(self) -> bool:
        """`loss.backward()` in a loop that also steps its optimizer: a training
        loop, not a test's or a helper's single backward pass."""
        for step in self.script.training_steps:
            call = step.backward
            if method_name(call) != "backward" or any(n.startswith("torch.") for n in self.qualified_names(call.func)):
                continue
            loop = step.loops[0].node if step.loops else None
            if loop is not None and any(loop in self.ancestors(s.call) for s in step.optimizer_steps):
                return True
        return False

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
        placed = next((a for a in call.args if a.keyword is not None and a.keyword.value == "device"), None) or (
            call.args[0] if method_name(call) == "to" and call.args else None
        )
        return placed is not None and isinstance(placed.value, cst.Name) and self._name_resolves_to_devices(call, placed.value.value)

    def _runs_at_import(self, node: cst.CSTNode) -> bool:
        """Outside every function and lambda (a parameter default counts as
        inside: it is not where the work is done) and outside the main guard."""
        guard = self.script.entry.main_guard
        return not any(isinstance(a, (cst.FunctionDef, cst.Lambda)) or a is guard for a in self.ancestors(node))

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

    def _get_device_call(self) -> cst.Call:
        if self._role == SELF_TEST:
            self._import_in_guard = not self._runtime_imported()  # importing the module imports nothing new
        elif self._get_device_name == "get_device":
            self.add_import(RUNTIME_MODULE, "get_device")
        else:
            self.add_import(RUNTIME_MODULE, "get_device", asname=self._get_device_name)
        return cst.Call(func=cst.Name(self._get_device_name))

    def _runtime_imported(self) -> bool:
        bindings = self.script.module_scope.bindings.get(self._get_device_name, ())
        return any(b.kind == "import" and b.qualified in GET_DEVICE for b in bindings)

    # Where a site gets its device name.

    def _placement(self, site: cst.CSTNode, current_gpu_in_library: bool = True) -> str:
        """The code of the device expression to use at `site`: an existing
        device variable in reach, else the added binding (in a library,
        `device_at()` unless `current_gpu_in_library` is False). "" when no
        name can be used safely there."""
        if self._gpu_choice is not None and self._chooses_device(site):
            return self._device_at(site, None)  # plain "cuda" means the GPU that the file selected
        if self._gpu_choice is not None:
            return ""
        existing = self._existing_device(site)
        if not self._chooses_device(site):
            # A library follows only a device that its own code defines: a
            # parameter is the caller's, who may have meant another device.
            if existing is not None and not self._names_a_parameter(existing, site):
                return existing
            # Else plain "cuda" stays the current GPU, as `device_at()` says
            # where CUDA is available (in a module a script of the run imports).
            return self._device_at(site, None) if current_gpu_in_library else ""
        if existing is not None:
            return existing
        name = self._binding_name
        if not name or not self._module_name_reaches(site, name):
            return ""
        self._needs_binding.add(site)
        return name

    def _report_unplaced(self, node: cst.CSTNode, subject: str, manual: str) -> None:
        """`node` is left alone because `_placement` found no device for it: say why."""
        if self._gpu_choice is not None:
            self.report(node, "AM313", f"{subject}: {self._gpu_choice_reason()}")
        elif not self._chooses_device(node):
            self.report(node, "AM311", f"{subject}: {SELF_TEST_ADVICE if self._role == SELF_TEST else LIBRARY_ADVICE}")
        else:
            self.report(node, "AM311", f"{subject}: {manual}")

    def _use_placement(self, site: cst.CSTNode, placement: str) -> cst.BaseExpression:
        """`site` is rewritten with `placement`: the node to put there."""
        if site in self._needs_binding:
            self._fallback_sites.append(site)
        if site in self._device_at_sites:
            self._placed_at.append(site)
            self.add_import(RUNTIME_MODULE, "device_at")
        return cst.parse_expression(placement)

    # The added binding.

    def _plan_binding(self) -> None:
        if not self._fallback_sites:
            return
        self._uses_runtime = True
        self._get_device_call()  # schedules the import
        if self._role == SELF_TEST:
            return  # bound at the top of the main guard: see leave_If
        first = min(self._top_level_index(site) for site in self._fallback_sites)
        anchor = None
        for statement in self._module.body[:first]:
            if is_import_line(statement):
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

    # -- rewriting --------------------------------------------------------------------------

    def on_leave(self, original_node, updated_node):
        updated_node = super().on_leave(original_node, updated_node)
        edit = self._edits.get(original_node)
        if edit is not None:
            return in_place_of(updated_node, edit(updated_node))
        return updated_node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._rewrite_body(original_node.body, updated_node.body)
        return updated_node if body is None else updated_node.with_changes(body=body)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        index = self._device_bound_in.get(original_node)
        return updated_node if index is None else self._bind_device(updated_node, index)

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if original_node is not self.script.entry.main_guard or self._role != SELF_TEST:
            return updated_node
        added = [runtime_import_line(RUNTIME_MODULE, self._get_device_name)] if self._import_in_guard else []
        if self._fallback_sites:
            added.append(binding_line(self._binding_name, self._get_device_name, blank_line_before=bool(added)))
        body = updated_node.body
        return updated_node.with_changes(body=body.with_changes(body=[*added, *body.body])) if added else updated_node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._rewrite_body(original_node.body, updated_node.body)
        body = list(updated_node.body if body is None else body)
        if self._binding_at_top:
            body.insert(after_docstring_and_future(body), binding_line(self._binding_name, self._get_device_name))
        updated_node = updated_node.with_changes(body=body)
        index = self._device_bound_in.get(original_node)
        return updated_node if index is None else self._bind_device(updated_node, index)

    def _rewrite_body(self, originals, updated) -> Optional[list]:
        """Unwrap, remove and insert statements of one body (matched by the
        original nodes); None when nothing in it changes."""
        touched = self._unwrapped | self._removed | self._bind_after.keys() | ({self._anchor} if self._anchor is not None else set())
        if touched.isdisjoint(originals):
            return None
        result: list = []
        for old, new in zip(originals, updated):
            result.extend(unwrap(new) if old in self._unwrapped else [new])
            if old is self._anchor:
                result.append(binding_line(self._binding_name, self._get_device_name))
            if old in self._bind_after:
                result.append(cst.parse_statement(self._bind_after[old]))
        return remove_statements(result, {new for old, new in zip(originals, updated) if old in self._removed})
