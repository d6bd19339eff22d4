"""Planning the move onto Accelerate: what the script model says is trained,
placed, printed and saved, turned into edits of the original tree (`Plan`),
or a `CannotMigrate` for what the codemod cannot make right.

Everything the migrated code calls on `accelerator` must run where that
name is visible: the training code lives in the entry point (the function
the `__main__` block calls, or a flat script's module level).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import (
    CLIP_GRAD_FUNCTIONS,
    code_of,
    dotted_name,
    has_star_args,
    is_docstring,
    keyword_arg,
    walk,
)
from .._shapes import is_shape_argument
from ..script import project_facts
from ..script import vocabulary as v
from ..script.devices import DEVICE_STRINGS
from ..script.entities import Entity
from ..script.reduction import MEAN, SUM, backward_reduction, loss_reduction
from ..script.steps import ITERATION_WRAPPERS, within_wrappers
from ..script.uses import uses_of
from ..script.workers_facts import workers_facts
from .common import (
    ACCELERATOR,
    ADDED_NAMES,
    NO_CUDA,
    PER_PROCESS_BATCHES,
    SAMPLER_ORDER,
    CannotMigrate,
    Plan,
    accelerator_call,
    accelerator_statement,
    expression,
    parity_accelerator_statement,
    statement,
    unwrapped,
)
from .draws import Draws, contiguous_rows
from .functions import (
    DEVICE_NAME_FLAGS,
    EntryFunctions,
    ExitsThroughParameters,
    cpu_flag,
    gpu_index_flag,
    own_scope,
    with_accelerator_argument,
)
from .handed import HandedStep, ReturnedLoader, handed_steps
from .metrics import ShardedEvaluation
from .placement import plan_placements
from .precision import MANUAL_STEP, Precision, mixed_precision
from .totals import accelerator_combined, plan_running_totals

# What DistributedDataParallel answers itself, as the bare module would.
WRAPPER_SAFE = frozenset(
    {"train", "eval", "parameters", "named_parameters", "zero_grad", "to", "cpu", "cuda", "modules", "named_modules",
     "children", "named_children", "buffers", "named_buffers", "apply", "requires_grad_", "training", "float",
     "double", "half", "register_forward_hook", "register_full_backward_hook"}
)  # fmt: skip
# Read through `accelerator.unwrap_model(model)`: keys without `module.`, and the model's own attributes.
THROUGH_UNWRAP = frozenset({"state_dict", "load_state_dict"})
CLIP_METHODS = {"clip_grad_norm_": "clip_grad_norm_", "clip_grad_norm": "clip_grad_norm_", "clip_grad_value_": "clip_grad_value_"}
WRITE_MODES = ("w", "a", "x")
# What a test deciding to wrap a model in DataParallel may ask without changing anything.
GPU_QUESTIONS = frozenset({"torch.cuda.device_count", "torch.cuda.is_available", "builtins.len"})
RANDOM_DRAWS = frozenset(f"torch.{f}" for f in ("randn", "rand", "randint", "randperm", "normal", "bernoulli", "multinomial", "randn_like", "rand_like", "randint_like"))


class Planner:
    # A training loop of another module that this file hands its model and loader is migrated there (handed.py).
    takes_handed_loops = True
    # Code outside the training code that writes, prints, clips or places on a GPU is refused; received.py
    # leaves a module's functions off the handed loop's path as they are.
    leaves_other_functions = False
    # The rows of a draw for the global batch that hold this process's samples (draws.py).
    own_rows = staticmethod(contiguous_rows)
    # A shuffled loader is iterated by the main process alone (`dispatch_batches=True`), which draws its order
    # from the global RNG where the other processes do not.
    dispatches_shuffled_loaders = True

    def __init__(self, codemod) -> None:
        self.codemod = codemod
        # `accelerate=parity`: the one-process run's numbers on N processes (split and dispatched batches).
        self.parity = codemod.parity
        self.script = codemod.script
        self.uses = uses_of(self.script)
        self.module: cst.Module = self.script.module
        self.config = self.module.config_for_parsing
        self.plan = Plan()
        self._returned_loaders_of: dict = {}  # a training loop -> the loader another module's function returns to it

    # -- the whole plan -----------------------------------------------------------------

    def make(self) -> Plan:
        self._refuse_if_already_distributed()
        self._refuse_on_name_clash()
        steps = self.script.training_steps
        handed = handed_steps(self) if not steps and self.takes_handed_loops and self.codemod.reads_handoffs else []
        steps = steps or handed
        if not steps:
            first = next((c for c in self.uses.calls if self.script.is_dataloader(c) or self.script.makes_optimizer(c)), None)
            raise CannotMigrate(first or self.module, "AM820", "no `backward()` call found, so no training loop: accelerate changed nothing")
        self.steps = steps
        own = [step for step in steps if not isinstance(step, HandedStep)]  # a handed loop's are its module's
        self.entry = self._entry_scope(steps)
        self.body = self._entry_body()
        self.precision = Precision(self)
        self.precision.plan_mixed_precision()
        self._take_handed_precision(handed)
        self._plan_accelerator()
        self._plan_devices()
        self._plan_data_parallel()
        prepared = self._plan_prepare(steps)
        self._plan_local_batch_shapes(own)
        plan_running_totals(self, own, self.combined_total)
        plan_placements(self)
        self._write_accelerator()
        self._plan_backward(own)
        self._plan_clipping()
        self._plan_model_attributes(prepared)
        self._plan_output()
        self._plan_exits_and_draws().note_per_process_layers(steps)
        self._refuse_use_before_accelerator()
        self._refuse_evaluation_on_host_data()
        self.functions.pass_accelerator(self.plan)
        self._pass_to_handed_loops(handed)
        return self.plan

    def _plan_exits_and_draws(self) -> Draws:
        """A loop that trains ends alike on every process, and its random draws are shared out (draws.py)."""
        ExitsThroughParameters(self.codemod).refuse_per_process_exits()
        draws = Draws(self, self.own_rows)
        draws.plan(RANDOM_DRAWS)
        draws.refuse_host_draws_of_the_batch()
        draws.note_draws_in_helpers(RANDOM_DRAWS)
        return draws

    def _take_handed_precision(self, handed) -> None:
        """The mixed precision a handed loop trains in: the Accelerator made here runs it (its module's autocast
        blocks and GradScaler are removed there, received.py)."""
        dtypes = {step.mixed_precision for step in handed} - {""}
        if not dtypes:
            return
        if self.precision.mode is not None or len(dtypes) > 1 or not dtypes <= {"fp16", "bf16"}:
            step = next(s for s in handed if s.mixed_precision)
            raise CannotMigrate(
                step.backward, "AM821",
                f"`{step.loop_name}` trains in mixed precision that cannot be read as one dtype, or this file has mixed "
                f"precision of its own too: accelerate changed nothing; {MANUAL_STEP}",
            )
        self.precision.mode = mixed_precision(dtypes.pop())

    def _pass_to_handed_loops(self, handed) -> None:
        """`accelerator=accelerator` at each call of another module's training loop, which takes it as a parameter."""
        for step in handed:
            self.plan.edit(step.backward, with_accelerator_argument)
            self.plan.fixes.append((
                step.backward, "AM801",
                f"`{ACCELERATOR}` passed to `{step.loop_name}`, whose training loop takes it: its backward, clipping, "
                f"output and checkpoints go through this Accelerator",
            ))

    # -- refusals -------------------------------------------------------------------------

    def _calls(self, names) -> list[cst.Call]:
        return [c for c in self.uses.calls if self.codemod.is_call_to(c, names)]

    def _refuse_if_already_distributed(self) -> None:
        for binding in self.script.imports:
            qualified = binding.qualified or ""
            if qualified == "accelerate" or qualified.startswith(("accelerate.", "accelmigrate.runtime")):
                raise CannotMigrate(binding.node, "AM822", f"this script already imports `{qualified}`: accelerate changed nothing")
        found = self._calls(v.ALREADY_DISTRIBUTED)
        if found:
            raise CannotMigrate(found[0], "AM822", "this script already sets up torch.distributed: accelerate changed nothing; move it onto Accelerate by hand or launch it as it is")

    def _refuse_on_name_clash(self) -> None:
        for name in ADDED_NAMES:
            for node in self.uses.names.get(name, ()):
                parent = self.codemod.parent(node)
                if isinstance(parent, cst.Attribute) and parent.attr is node or isinstance(parent, cst.Arg) and parent.keyword is node:
                    continue
                raise CannotMigrate(node, "AM825", f"`{name}` already names something in this file, and the migrated code needs that name: rename yours, then run accelerate again")

    # -- where the accelerator lives ----------------------------------------------------

    def _entry_scope(self, steps):
        """The function the `__main__` block calls once (else the module): the training steps run in its own
        code or in functions it alone calls, which receive the accelerator (functions.py)."""
        scopes = {own_scope(step.function): None for step in steps}
        reasons = []
        if not any(step.steps_in_caller for step in steps):
            for entry in [*self._guard_functions(), self.script.module_scope]:
                self.functions = EntryFunctions(self, entry)
                outside = [self.script.flow.function_of(s) for s in scopes if s is not entry]
                # None: a step at module level, which no guard function's accelerator can reach.
                why = next(("a training step runs at module level" if f is None else self.functions.why_not(f) for f in outside if f is None or self.functions.why_not(f)), "")
                if not why:
                    return entry
                reasons.append(why)
        step = steps[0]
        why = f" ({reasons[0]})" if reasons and reasons[0] else ""
        raise CannotMigrate(
            step.backward, "AM820",
            f"the training step runs in `{step.function.name}`, not in the function the `__main__` block calls, nor in "
            f"a function that the entry point alone calls{why}: accelerate changed nothing; move the training loop "
            f"into that function (or make `accelerator` a parameter of `{step.function.name}` and its callers by hand), "
            f"then run accelerate again",
        )

    def _guard_functions(self) -> list:
        """The scopes of the module's functions that the `__main__` block calls by name, once (not in a loop), and
        that nothing runs at import."""
        entry = self.script.entry
        found = {}
        for call in self.uses.calls if entry.main_guard is not None else ():
            if not isinstance(call.func, cst.Name) or not any(a is entry.main_guard for a in self.codemod.ancestors(call)):
                continue
            callee = self.script.flow.callee(call, self.script.scope_of(call))
            if callee is None or callee[1] or self.codemod.parent(callee[0].node) is not self.module:
                continue
            if callee[0].name not in entry.runs_at_import and not self.script.loops_around(call):
                found[callee[0].scope] = None
        return list(found)

    def _entry_body(self) -> list:
        """The entry point's statements; at module level, the `__main__` block's own statements in its place
        (a script whose training runs in that block: they run as the module's, and bind its globals)."""
        node = self.entry.node
        if not isinstance(node, cst.Module):
            return list(node.body.body)
        return [inner for s in node.body for inner in (self._main_block() if s is self.script.entry.main_guard else [s])]

    def _main_block(self) -> list:
        guard = self.script.entry.main_guard
        if guard is None or guard.orelse is not None or not isinstance(guard.body, cst.IndentedBlock):
            return [guard] if guard is not None else []
        return list(guard.body.body)

    def _left_alone(self, node: cst.CSTNode) -> bool:
        """Outside the code the plan migrates, in a file whose other functions stay as they are (received.py)."""
        return self.leaves_other_functions and not self.in_entry(node)

    def in_entry(self, node: cst.CSTNode) -> bool:
        """In the entry point's own code, or in a function it alone calls, which receives the accelerator."""
        return self._in_entry_itself(node) or self.functions.function_of(node) is not None

    def _in_entry_itself(self, node: cst.CSTNode) -> bool:
        return own_scope(self.script.scope_of(node)) is self.entry

    def entry_statement(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The entry point's own statement that runs `node`: the one holding it, or the first call of the function
        (that receives the accelerator) holding it."""
        return self.top_statement(node) or self.functions.first_call_statement(node, self.top_statement)

    def top_statement(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The statement of the entry point's own body that holds `node`."""
        body = set(self.body)
        if node in body:
            return node
        return next((a for a in self.codemod.ancestors(node) if a in body), None)

    def _plan_accelerator(self) -> None:
        if self.entry.kind == "module":
            runs = {*self.script.entry.flat, *(s for s in self._main_block() if s is not self.script.entry.main_guard)}
            anchor = next((s for s in self.body if s in runs), None)
        else:
            anchor = next((s for s in self.body if not is_docstring(s)), None)
        if anchor is None:
            raise CannotMigrate(self.module, "AM820", "no code that runs in this file to make the `Accelerator` in: accelerate changed nothing")
        self.accelerator_anchor = anchor
        self.moved_after = None  # the statement parsing a `--no-cuda` flag the Accelerator reads, when it follows
        self.cpu, self.own_cpu_flag = NO_CUDA, None
        self.shuffled_loaders, self.returned_loaders, self.factory_loaders = [], [], []
        if self.parity:
            self.plan.imports += [("accelerate", "Accelerator"), ("accelerate", "DataLoaderConfiguration"), ("torch", None)]
            self.plan.fixes.append((anchor, "AM801", "one `Accelerator` made here: it joins the launch's processes (a world of one under plain `python`), picks the device, and keeps the DataLoader's batch size as the global batch (`split_batches=True`)"))
        else:
            self.plan.imports += [("accelerate", "Accelerator")]
            self.plan.fixes.append((anchor, "AM801", "one `Accelerator` made here: it joins the processes `accelerate launch` starts (a world of one under plain `python`) and picks the device; the number of processes, the CPU or GPUs and the like come from `accelerate launch` or `accelerate config`"))

    def _write_accelerator(self) -> None:
        """Written once the training loaders are read: with `accelerate=parity`, a shuffled one is dispatched from
        rank 0; by default Accelerate's own sharding, with the note that says what differs on N processes."""
        if not self.parity:
            made = accelerator_statement(self.precision.mode, self.own_cpu_flag)
            self.plan.before.setdefault(self.accelerator_anchor, []).insert(0, statement(made, self.config))
            self.plan.notes.append((self.accelerator_anchor, "AM834", PER_PROCESS_BATCHES))
            for call in [*self.shuffled_loaders, *self.returned_loaders, *self.factory_loaders]:
                self.plan.notes.append((call, "AM835", SAMPLER_ORDER))
            return
        dispatch = bool(self.shuffled_loaders or self.returned_loaders or self.factory_loaders)
        self._refuse_time_first_batches(dispatch)
        self.plan.before.setdefault(self.accelerator_anchor, []).insert(0, statement(parity_accelerator_statement(dispatch, self.precision.mode, self.cpu), self.config))
        for call in self.shuffled_loaders:
            self.plan.fixes.append((call, "AM810", "training DataLoader that shuffles (or has its own sampler): on N processes rank 0 alone iterates it, drawing the original's order, and sends each process its slice of every batch (`dispatch_batches=True`); its batches must be tensors"))
        for call in self.returned_loaders:
            self.plan.fixes.append((call, "AM810", "training DataLoader built in another module, which may shuffle: on N processes rank 0 alone iterates it, in the original's order, and sends each process its slice of every batch (`dispatch_batches=True`); its batches must be tensors"))
        for call in self.factory_loaders:
            self.plan.fixes.append((call, "AM810", f"training DataLoader made by `{code_of(call.func)}`, which may shuffle: on N processes rank 0 alone iterates it, in the original's order, and sends each process its slice of every batch (`dispatch_batches=True`); its batches must be tensors"))

    def _refuse_time_first_batches(self, dispatch: bool) -> None:
        """A dispatched batch is cut along its first dimension, which must then be the samples': a training loader
        whose collate function pads sequences time-first (`pad_sequence` without `batch_first=True`) would give
        each process a stretch of time steps of every sequence. Not dispatched, each process collates its own
        samples, and the batches are right whatever their layout."""
        time_first_elsewhere = {name for name, _ in project_facts.current().time_first_loaders} if self.codemod.reads_handoffs else set()
        for loader in self.training_loaders if dispatch else ():
            if isinstance(loader, ReturnedLoader) and self.script.qualified_names(loader.call.func) & time_first_elsewhere:
                raise CannotMigrate(
                    loader.call, "AM829",
                    f"`{code_of(loader.call.func)}` returns training batches padded time-first (`pad_sequence` without "
                    f"`batch_first=True` in its loader's collate function), and a batch that rank 0 sends out is cut along "
                    f"its first dimension: accelerate changed nothing; pad with `batch_first=True` there, or migrate by hand",
                )
            made = self._dataloader_call(loader)
            padding = self.script.time_first_padding(made) if made is not None else None
            if padding is not None:
                raise CannotMigrate(
                    padding, "AM829",
                    f"`{code_of(padding)}` pads the training batches time-first, and a batch that rank 0 sends out "
                    f"(`dispatch_batches=True`, which keeps a shuffled loader's order) is cut along its first "
                    f"dimension: accelerate changed nothing; pad with `batch_first=True` (and index the batch that "
                    f"way), or prepare the loader by hand without dispatching its batches",
                )

    # -- devices ----------------------------------------------------------------------------

    def _plan_devices(self) -> None:
        self.gpu_index_calls = set()  # `.cuda(args.gpu)` and `torch.cuda.set_device(args.gpu)`: the flag's reads
        self.accelerator_device_names = set()  # the entry point's names now bound to `accelerator.device`
        for binding in self.script.devices:
            if binding.kind in ("parameter", "parsed") or self._keeps_a_parameter(binding):
                continue  # receives what the entry point passes: `accelerator.device`; `args.device` is its flag's
            if binding.kind == "flag" and self.moved_after is None and self._read_cpu_flag(binding):
                continue
            if binding.kind == "flag" and self._read_gpu_index_flag(binding):
                continue
            if self._chosen_per_process(binding):
                continue
            if binding.kind in ("torch.device", "string", "get_device") and self._chosen_where_migrated(binding):
                target = self.codemod.parent(binding.node)
                assign = self.codemod.parent(target) if isinstance(target, cst.AssignTarget) else target
                if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
                    self.plan.edit(assign, lambda updated: updated.with_changes(value=expression(f"{ACCELERATOR}.device")))
                    self.plan.fixes.append((assign, "AM803", f"`{binding.name} = {ACCELERATOR}.device`: the device accelerate gives this process"))
                    self.accelerator_device_names.add(binding.name)
                    if binding.kind == "string":
                        self._compare_device_types(binding)
                    continue
            raise CannotMigrate(binding.node, "AM827", self._device_refusal(binding))
        for call in self.uses.calls:
            if not isinstance(call.func, cst.Attribute):
                continue
            method = call.func.attr.value
            literal = method == "to" and call.args and isinstance(call.args[0].value, cst.SimpleString) and "cuda" in call.args[0].value.value
            if method == "cuda" and (not any(a.keyword is None for a in call.args) or call in self.gpu_index_calls) or literal:
                if self._left_alone(call):
                    continue
                if not self.in_entry(call):
                    raise CannotMigrate(call, "AM827", f"`{code_of(call.func)}(...)` outside the entry point: accelerate changed nothing; place it on the device passed in (`.to(device)` with `device = {ACCELERATOR}.device`), then run accelerate again")
                kept = [a for a in call.args[1 if literal else 0:] if a.keyword is not None]
                self.plan.edit(call, lambda updated, kept=kept: updated.with_changes(
                    func=updated.func.with_changes(attr=cst.Name("to")),
                    args=[cst.Arg(value=expression(f"{ACCELERATOR}.device")), *([cst.Arg(keyword=a.keyword, value=a.value, equal=a.equal) for a in kept])],
                ))
                self.plan.fixes.append((call, "AM803", f"`.to({ACCELERATOR}.device)`: each process places its tensors on its own device"))
        for call in self._calls(v.SET_DEVICE | v.CUDA_DEVICE_CONTEXT):
            if call in self.gpu_index_calls:
                continue  # dropped: accelerate sets each process's device
            raise CannotMigrate(call, "AM827", "the script picks its GPU itself: accelerate changed nothing; remove the GPU selection (accelerate gives each process its GPU), then run accelerate again")
        for call in self._calls({"torch.device"}):
            if not any(b.node is call or self.codemod.parent(call) is self.codemod.parent(b.node) for b in self.script.devices):
                if any(isinstance(a.value, cst.SimpleString) and "cuda" in a.value.value for a in call.args):
                    raise CannotMigrate(call, "AM827", f"`{code_of(call)}` in an expression: accelerate changed nothing; use `{ACCELERATOR}.device` there, then run accelerate again")

    def _chosen_where_migrated(self, binding) -> bool:
        """`device = ...` in the entry point, or `self.device = ...` in a trainer's method that receives the accelerator."""
        if binding.scope is self.entry:
            return isinstance(binding.node, cst.Name) or _parsed_argument(binding.node)
        self_attribute = isinstance(binding.node, cst.Attribute) and isinstance(binding.node.value, cst.Name) and binding.node.value.value == "self"
        return self_attribute and self.functions.function_of(binding.node) is not None

    def _keeps_a_parameter(self, binding) -> bool:
        """`self.device = device` in a method whose parameter `device` receives what its callers pass."""
        return isinstance(binding.node, cst.Attribute) and any(
            b.kind == "param" for b in binding.scope.bindings.get(binding.value, ())
        )

    def _chosen_per_process(self, binding) -> bool:
        """`device = torch.device("cuda" if torch.cuda.is_available() else "cpu")` at module level, read only in
        functions that run after the Accelerator is made: right as it is. Without an index, "cuda" is the current
        GPU, which Accelerate makes each process's own, and the choice is the Accelerator's
        (`cpu=not torch.cuda.is_available()`); read at import, it would place on the first GPU in every process."""
        if self.entry.kind != "function" or binding.scope is not self.script.module_scope or not isinstance(binding.node, cst.Name):
            return False
        if any(b.kind == "flag" for b in self.script.devices):
            return False  # the Accelerator then follows the flag
        assign = self.codemod.parent(self.codemod.parent(binding.node))
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return False
        value = assign.value
        if isinstance(value, cst.Call) and self.script.is_call_to(value, {"torch.device"}) and len(value.args) == 1 and value.args[0].keyword is None:
            value = value.args[0].value
        if not (
            isinstance(value, cst.IfExp) and isinstance(value.body, cst.SimpleString) and isinstance(value.orelse, cst.SimpleString)
            and (value.body.evaluated_value, value.orelse.evaluated_value) == ("cuda", "cpu")
            and isinstance(value.test, cst.Call) and self.script.is_call_to(value.test, {"torch.cuda.is_available"})
        ):
            return False
        at_import = set(self.script.entry.runs_at_import)
        for read in self.uses.reads(binding.name, self.script.module_scope):
            function = self.script.flow.function_of(self.script.scope_of(read))
            if function is None or function.name in at_import:
                return False
        return True

    def _device_refusal(self, binding) -> str:
        if binding.kind == "flag":
            return (
                f"device chosen by the `{binding.name}` flag: accelerate changed nothing; accelerate gives each process "
                f"its device (`accelerate launch --cpu` keeps a run on the CPU): drop the flag and read `{ACCELERATOR}.device` "
                f"where the script reads it, then run accelerate again"
            )
        if "[" in binding.name:
            return (
                f"device `{binding.name}` set in the script's settings before the Accelerator is made: accelerate changed "
                f"nothing; read `{ACCELERATOR}.device` where the script reads `{binding.name}`, then run accelerate again"
            )
        guard = self.script.entry.main_guard
        if self.entry.kind == "function" and guard is not None and any(a is guard for a in self.codemod.ancestors(binding.node)):
            # The Accelerator is made in the function the block calls, after the block has chosen the device.
            return (
                f"device `{binding.name}` chosen in the `__main__` block, which passes it to `{self.entry.name}`, where the "
                f"Accelerator is made: accelerate changed nothing; move the block's code into a function `main()` that the "
                f"block calls (`{self.entry.name}` then receives `{ACCELERATOR}`), then run accelerate again"
            )
        return (
            f"device `{binding.name}` chosen outside the entry point's own assignments: accelerate changed nothing; "
            f"make it `{binding.name} = {ACCELERATOR}.device` after the Accelerator is made (each process has its own), then run accelerate again"
        )

    def _read_cpu_flag(self, binding) -> bool:
        """`--no-cuda` kept: the Accelerator keeps the run on the CPU when it is given, made once the flag is parsed."""
        flag = cpu_flag(self, binding.node)
        if flag is None:
            return False
        if flag.parsed_at is not None and self.body.index(flag.parsed_at) >= self.body.index(self.accelerator_anchor):
            following = self.body.index(flag.parsed_at) + 1
            if following == len(self.body):
                return False
            anchor = self.body[following]
            self.plan.fixes = [(anchor if node is self.accelerator_anchor and code == "AM801" else node, code, message) for node, code, message in self.plan.fixes]
            self.accelerator_anchor, self.moved_after = anchor, flag.parsed_at
        if binding.name in DEVICE_NAME_FLAGS:
            self._refuse_other_device_reads(binding, flag.reads)
        self.cpu = f"{flag.asks_for_cpu} or not torch.cuda.is_available()"
        self.own_cpu_flag = flag.asks_for_cpu
        self.plan.fixes.append((binding.node, "AM803", f"`Accelerator(cpu={self.cpu if self.parity else self.own_cpu_flag})`: the flag still keeps the run on the CPU"))
        return True

    def _refuse_other_device_reads(self, binding, reads) -> None:
        """`--device`: its value read only as `device = args.device` of the entry point, which becomes
        `accelerator.device`; read anywhere else it would put every process on the one device it names."""
        rewritten = {b.node for b in self.script.devices if b.kind == "string" and b.scope is self.entry and isinstance(b.node, cst.Name)}
        for read in reads:
            assign = self.codemod.parent(read)
            if isinstance(assign, cst.Assign) and assign.value is read and len(assign.targets) == 1 and assign.targets[0].target in rewritten:
                continue
            raise CannotMigrate(
                read, "AM827",
                f"`{code_of(read)}` read here, not only as `device = {code_of(read)}` in the entry point: accelerate changed "
                f"nothing; every process would use the one device it names: read `device` (which becomes `{ACCELERATOR}.device`) "
                f"here, then run accelerate again",
            )

    def _read_gpu_index_flag(self, binding) -> bool:
        """`--gpu N` read only by `torch.cuda.set_device(args.gpu)` (dropped: accelerate sets each process's device) and
        `.cuda(args.gpu, ...)` (which becomes `.to(accelerator.device, ...)`); the flag itself stays, unread."""
        flag = gpu_index_flag(self, binding.node)
        if flag is None:
            return False
        dropped = []
        for read in flag.reads:
            arg = self.codemod.parent(read)
            call = self.codemod.parent(arg) if isinstance(arg, cst.Arg) else None
            first = isinstance(call, cst.Call) and call.args and call.args[0] is arg and arg.keyword is None
            if first and self.codemod.is_call_to(call, v.SET_DEVICE) and len(call.args) == 1:
                expr = self.codemod.parent(call)
                line = self.codemod.parent(expr)
                if isinstance(expr, cst.Expr) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                    dropped.append((call, line))
                    continue
            if first and isinstance(call.func, cst.Attribute) and call.func.attr.value == "cuda":
                self.gpu_index_calls.add(call)
                continue
            raise CannotMigrate(
                read, "AM827",
                f"`{code_of(read)}` read here, not only by `torch.cuda.set_device({code_of(read)})` and `.cuda({code_of(read)})`: "
                f"accelerate changed nothing; accelerate gives each process its GPU: read `{ACCELERATOR}.device` here, then run accelerate again",
            )
        for call, line in dropped:
            self._drop(line)
            if not any(a in self.plan.removed for a in (line, *self.codemod.ancestors(line))):
                continue  # a block it is alone in keeps it: refused below as the script picking its GPU
            self.gpu_index_calls.add(call)
            self.plan.fixes.append((call, "AM803", f"`{code_of(call)}` removed: accelerate sets each process's device"))
        return True

    def _compare_device_types(self, binding) -> None:
        """`device == "cuda"` of a string device becomes `device.type == "cuda"`: `accelerator.device` is a
        `torch.device`, which equals no string."""
        for node in self.uses.names.get(binding.name, ()):
            parent = self.codemod.parent(node)
            if isinstance(parent, cst.ComparisonTarget) and parent.comparator is node:
                comparison = self.codemod.parent(parent)
                other = comparison.left if len(comparison.comparisons) == 1 else None
            elif isinstance(parent, cst.Comparison) and parent.left is node and len(parent.comparisons) == 1:
                other = parent.comparisons[0].comparator
            else:
                continue
            if not (isinstance(other, cst.SimpleString) and other.evaluated_value in DEVICE_STRINGS):
                continue
            if not any(b.node is binding.node for b in self.script.bindings_of(binding.name, node)):
                continue
            self.plan.edit(node, lambda updated: cst.Attribute(value=updated, attr=cst.Name("type")))

    def _refuse_use_before_accelerator(self) -> None:
        """Made after the arguments are parsed, the Accelerator must come before everything that uses it."""
        if self.moved_after is None:
            return
        made_at = self.body.index(self.accelerator_anchor)
        for node in [*self.plan.edits, *self.plan.guarded, *self.plan.before, *self.plan.after]:
            top = self.entry_statement(node)
            if top is not None and self.body.index(top) < made_at and node is not self.accelerator_anchor:
                raise CannotMigrate(
                    node, "AM827",
                    "this line needs the Accelerator, which reads the `--no-cuda` flag and so is made once the arguments "
                    "are parsed, after it: accelerate changed nothing; parse the arguments first, then run accelerate again",
                )

    # -- DataParallel ---------------------------------------------------------------------

    def _plan_data_parallel(self) -> None:
        for call in self._calls(v.DATA_PARALLEL):
            if not call.args or call.args[0].keyword is not None or has_star_args(call):
                raise CannotMigrate(call, "AM806", "DataParallel whose module cannot be seen: remove it by hand, then run accelerate again")
            self.plan.edit(call, lambda updated: updated.args[0].value)
            line = self._rewraps_itself(call)
            if line is not None:
                self._drop(line)  # `model = model` would be all that is left
            self.plan.fixes.append((call, "AM806", "DataParallel removed: `accelerator.prepare` wraps the model for the processes the launch starts"))
            self.codemod.remove_import_of(call.func)

    def _rewraps_itself(self, call: cst.Call) -> cst.SimpleStatementLine | None:
        """The line `model = nn.DataParallel(model, ...)`, alone on its line."""
        assign = self.codemod.parent(call)
        if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1):
            return None
        if code_of(assign.targets[0].target) != code_of(call.args[0].value) or not dotted_name(assign.targets[0].target):
            return None
        line = self.codemod.parent(assign)
        return line if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None

    def _drop(self, line: cst.SimpleStatementLine) -> None:
        """Drop the line, or the `if` it is the only statement of when the test
        only asks how many GPUs there are (`if torch.cuda.device_count() > 1:`);
        an `if` with an `else`, or a block the line or the `if` is alone in,
        keeps `model = model`."""
        block = self.codemod.parent(line)
        if any(other is not line and other not in self.plan.removed for other in block.body):
            self.plan.removed.add(line)
            return
        branch = self.codemod.parent(block)
        if not (isinstance(branch, cst.If) and branch.orelse is None and self._asks_only(branch.test)):
            return
        outer = self.codemod.parent(branch)
        if isinstance(outer, (cst.IndentedBlock, cst.Module)) and any(other is not branch and other not in self.plan.removed for other in outer.body):
            self.plan.removed.add(branch)

    def _asks_only(self, test: cst.BaseExpression) -> bool:
        """A test without side effects: names, attributes, constants, comparisons and the GPU count."""
        for node in walk(test):
            if isinstance(node, cst.Call) and not self.codemod.is_call_to(node, GPU_QUESTIONS):
                return False
            if isinstance(node, (cst.NamedExpr, cst.Await, cst.Yield)):
                return False
        return True

    # -- prepare ----------------------------------------------------------------------------

    def _plan_prepare(self, steps) -> set:
        names: dict[str, None] = {}
        self._constructions: dict[cst.Call, None] = {}  # `Trainer(model, optimizer)`, keeping what is prepared
        self._held: dict[str, object] = {}  # `self.net` made by a trainer's `__init__`: prepared there
        self._per_epoch: dict[str, cst.CSTNode] = {}  # a training loader made anew each epoch -> its statement
        model_names: dict[str, None] = {}
        for step in steps:
            if not step.is_complete:
                raise CannotMigrate(step.backward, "AM820", "a backward with no optimizer step in reach: accelerate changed nothing")
            for model in step.models:
                model_names[self._prepared_name(model)] = None
        if not model_names:
            raise CannotMigrate(steps[0].backward, "AM820", "no model found whose forward makes the loss: accelerate changed nothing; pass the model through `accelerator.prepare` by hand")
        names.update(model_names)
        for step in steps:
            for optimizer_step in step.optimizer_steps:
                if optimizer_step.entity is None:
                    raise CannotMigrate(optimizer_step.call, "AM820", f"optimizer `{optimizer_step.optimizer}` not traced to where it is made: accelerate changed nothing")
                names[self._prepared_name(optimizer_step.entity)] = None
        self.training_loaders = []
        for step in steps:
            for loop in step.loops or step.called_in_loops:  # or the loop around a step function's calls
                # Once each: one loader may feed several steps (a GAN's two optimizers).
                loader = self.loader_of(loop)
                if loader is not None and loader not in self.training_loaders:
                    names[self._prepared_name(loader)] = None
                    self.training_loaders.append(loader)
        if not self.training_loaders:
            raise CannotMigrate(steps[0].backward, "AM820", "training loop over no DataLoader found: accelerate changed nothing; pass the training DataLoader through `accelerator.prepare` by hand")
        for scheduler in self.script.schedulers:
            if scheduler.scope is self.entry and (self.parity or self._stepped_per_batch(scheduler.name, steps)):
                names[scheduler.name] = None
        first_training = min(self.body.index(self.entry_statement(step.backward)) for step in steps)
        # Evaluation loaders that can be sharded, prepared with the rest (their gathers planned).
        names.update(dict.fromkeys(ShardedEvaluation(self, model_names, first_training).plan()))
        last_binding = self.body.index(self.accelerator_anchor)
        for name in names:
            if name in self._held:
                continue
            if "." in name:
                raise CannotMigrate(steps[0].backward, "AM820", f"`{name}` is not a plain name of the entry point: accelerate changed nothing; bind it to a name there and run accelerate again")
            positions = [self.body.index(t) for b in self.entry.bindings.get(name, ()) for t in [self.top_statement(b.node)] if t is not None]
            if positions and max(positions) >= first_training and self._made_per_epoch(name, steps):
                continue
            if not positions or max(positions) >= first_training:
                raise CannotMigrate(steps[0].backward, "AM820", f"`{name}` is bound inside or after the training loop: accelerate changed nothing; make it once before the loop, then run accelerate again")
            last_binding = max(last_binding, *positions)
        for call in self._constructions:
            made_at = self.entry_statement(call)
            if made_at is None or self.body.index(made_at) <= last_binding:
                raise CannotMigrate(call, "AM820", f"`{code_of(call)}` keeps objects to prepare before the last of them is made, where `{ACCELERATOR}.prepare` goes: accelerate changed nothing; make the instance after the model, optimizer and DataLoader, then run accelerate again")
        for loader in self.training_loaders:
            if isinstance(loader, ReturnedLoader):
                self._check_returned_loader(loader)
            else:
                self._check_loader(loader)
        for step in steps:
            for loop in step.loops or step.called_in_loops:  # or the loop around a step function's calls
                if self.loader_of(loop) is not None:
                    self._refuse_wrapper_before_prepare(loop, last_binding)
        in_entry = [name for name in names if name not in self._held and name not in self._per_epoch]
        for name, made_at in self._per_epoch.items():
            self._write_prepare(made_at, [name])
        if in_entry:
            self._write_prepare(self.body[last_binding], in_entry)
        if self._held:
            self._write_prepare(self._held_anchor(steps[0].backward), list(self._held))
            self._refuse_models_read_on_the_instance()
        self.prepared_at = last_binding
        self.model_names = set(model_names)
        self.prepared_names = set(names)
        return set(model_names)

    def _stepped_per_batch(self, scheduler: str, steps) -> bool:
        """Every `scheduler.step()` the file calls by that name is in a loop over a training loader. A prepared
        scheduler steps once per process at each call (an epoch of N processes has N times fewer batches, so a
        schedule over batches keeps its length); one stepped per epoch would then decay N times faster, so by
        default it stays as it is (AM836)."""
        loops = [loop.node for step in steps for loop in step.loops if self.loader_of(loop) is not None]
        calls = [
            call for call in self.uses.calls
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "step" and dotted_name(call.func.value) == scheduler
        ]
        if all(any(a in loops for a in self.codemod.ancestors(call)) for call in calls):
            return True  # or stepped under another name, where it cannot be told: prepared, as the guide does
        if calls:  # stepped elsewhere as well: per epoch
            self.plan.notes.append((calls[0], "AM836", f"`{scheduler}` steps once per epoch: left out of `{ACCELERATOR}.prepare`, which would step it once per process at each call (for schedules over batches)"))
        return False

    def loader_of(self, loop):
        """The DataLoader a training loop iterates: the script's own (`loop.loader`), or one that a function of
        another module of the project builds and returns to the name the loop iterates (`dataloader =
        get_celeba(params)`, the fact `sharded_loaders`), prepared here all the same."""
        if loop.loader is not None or not self.codemod.reads_handoffs:
            return loop.loader
        if loop.node not in self._returned_loaders_of:
            returned = self.script.loader_returned_to(loop.node)
            self._returned_loaders_of[loop.node] = ReturnedLoader.of(*returned) if returned is not None else None
        return self._returned_loaders_of[loop.node]

    def _prepared_name(self, entity) -> str:
        """The entry point's name for what a training step trains: the entity's own, or for `self.model` of a class
        whose methods receive the accelerator, the name its instances are made with (`Trainer(model, optimizer)`)."""
        name = self.functions.constructed_with(entity) if isinstance(entity, Entity) else ""
        if not name:
            if isinstance(entity, Entity) and self.functions.kept_by_init(entity) is not None:
                self._held[entity.name] = entity
            return entity.name
        self._constructions.update(dict.fromkeys(site.call for site in self.script.flow.function_of(entity.scope).callers))
        return name

    def _made_per_epoch(self, name: str, steps) -> bool:
        """A training DataLoader made anew in the loop around the training loop (`for epoch ...: loader =
        DataLoader(...)`, then `for batch in loader:`): prepared right where it is made, each time. Its one
        binding is a statement of that loop's own block, and every training loop over it comes later in the block."""
        loaders = [loader for loader in self.training_loaders if loader.name == name and isinstance(loader, Entity)]
        bindings = self.entry.bindings.get(name, ())
        if len(loaders) != 1 or len(bindings) != 1 or not isinstance(loaders[0].value, cst.Call):
            return False
        made_at = next((a for a in self.codemod.ancestors(bindings[0].node) if isinstance(a, cst.SimpleStatementLine)), None)
        block = self.codemod.parent(made_at) if made_at is not None else None
        if not isinstance(block, cst.IndentedBlock) or not isinstance(self.codemod.parent(block), (cst.For, cst.While)):
            return False
        later = list(block.body)[list(block.body).index(made_at) + 1:]
        training_loops = [loop.node for step in steps for loop in step.loops if self.loader_of(loop) is loaders[0]]
        if not training_loops or not all(any(a in later for a in [loop, *self.codemod.ancestors(loop)]) for loop in training_loops):
            return False
        self._per_epoch[name] = made_at
        return True

    def _write_prepare(self, anchor: cst.CSTNode, names: list) -> None:
        listed = ", ".join(names)
        self.plan.after.setdefault(anchor, []).append(statement(f"{listed} = {ACCELERATOR}.prepare({listed})", self.config))
        self.plan.fixes.append((anchor, "AM802", f"`{ACCELERATOR}.prepare({listed})`: the model wrapped for the processes, the optimizer and scheduler step with it, and each process reads its slice of every batch"))

    def _held_anchor(self, backward: cst.CSTNode) -> cst.CSTNode:
        """The statement of a trainer's `__init__` after which what it makes (`self.net`, `self.optim`,
        `self.loader`) is all made: each bound by a statement of its own body, or by a method it calls there."""
        tops = [self.functions.kept_by_init(entity) for entity in self._held.values()]
        blocks = {self.codemod.parent(top) for top in tops}
        if len(blocks) > 1:
            raise CannotMigrate(backward, "AM820", "the objects to prepare are made by the `__init__` of more than one class: accelerate changed nothing; prepare them by hand")
        body = list(blocks.pop().body)
        return max(tops, key=body.index)

    def _refuse_models_read_on_the_instance(self) -> None:
        """`solver.net.state_dict()` outside the class: the model an instance keeps is the prepared one, whose
        own attributes (and state_dict keys) its wrapper hides; only `self.net` is planned through the bare module."""
        attributes = {entity.name.removeprefix("self.") for entity in self._held.values() if entity.kind == "model"}
        for attribute in sorted(attributes):
            for node in self.uses.names.get(attribute, ()):
                parent = self.codemod.parent(node)
                if not (isinstance(parent, cst.Attribute) and parent.attr is node) or (isinstance(parent.value, cst.Name) and parent.value.value == "self"):
                    continue
                outer = self.codemod.parent(parent)
                if isinstance(outer, cst.Attribute) and outer.value is parent and outer.attr.value in WRAPPER_SAFE:
                    continue
                raise CannotMigrate(parent, "AM824", f"`{code_of(parent)}` reads the model the instance keeps, which is the prepared one, outside its class: accelerate changed nothing; read it in the class's own methods, or through `{ACCELERATOR}.unwrap_model({code_of(parent)})` by hand")

    def _refuse_evaluation_on_host_data(self) -> None:
        """A script that places nothing on a device computes everything on the
        CPU; `prepare` moves the model onto each process's device, and the
        prepared loaders' batches with it, but nothing else: a forward of the
        model in evaluation (under no_grad or inference_mode, in a loop over a
        loader left as it is, or in the entry point itself, outside its loops,
        after `prepare`) on data that no prepared loader yields would meet the
        model on another device at the first evaluation on a GPU. Refused,
        with the step that makes it right."""
        if not self._places_nothing():
            return
        for call in self.uses.calls:
            if not (isinstance(call.func, cst.Name) and call.func.value in self.model_names and call.args):
                continue
            if self._before_prepare(call):
                continue  # the model is still where the script made it
            loops = self.script.loops_around(call)
            innermost = loops[0] if loops else None
            over_loader = innermost is not None and innermost.loader is not None
            if over_loader and innermost.loader.name in self.prepared_names:
                continue  # batches of a prepared loader: on the device already
            in_entry_after_training = innermost is None and self.script.scope_of(call) is self.entry
            if self.script.in_evaluation(call) or over_loader or in_entry_after_training:
                raise CannotMigrate(call, "AM827", (
                    f"`{code_of(call)}` evaluates the model on data this script keeps on the CPU (it places nothing on a "
                    f"device), while `{ACCELERATOR}.prepare` moves the model onto each process's device: on a GPU this "
                    "stops at the first evaluation with a device mismatch; accelerate changed nothing; choose the "
                    "device in the script (`device = torch.device(\"cuda\" if torch.cuda.is_available() else \"cpu\")`, "
                    "the model and each batch it is given `.to(device)`), then run accelerate again"
                ))

    def _places_nothing(self) -> bool:
        """No device in the script, and nothing moved onto one (`.cuda()`, `.to(device)`)."""
        if self.script.devices:
            return False
        for call in self.uses.calls:
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "cuda":
                return False
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "to" and call.args:
                if self.script.holds_device(call.args[0].value, call):
                    return False
        return True

    def _refuse_wrapper_before_prepare(self, loop, last_binding: int) -> None:
        """`progress_bar = tqdm(train_loader)` iterated by the training loop must wrap the prepared loader: made
        after `prepare` (in the epoch loop, or in a function the entry point calls), not before it."""
        if not isinstance(loop.node, cst.For):
            return  # a handed loop's call with no loop around it here
        iterable = within_wrappers(loop.node.iter, lambda call: self.codemod.is_call_to(call, ITERATION_WRAPPERS))
        loader = self.loader_of(loop)
        if not isinstance(iterable, cst.Name) or iterable.value == loader.name:
            return
        for binding in self.script.bindings_of(iterable.value, iterable):
            top = self.entry_statement(binding.node)
            if top is None or self.body.index(top) <= last_binding:
                raise CannotMigrate(
                    binding.node, "AM820",
                    f"`{iterable.value}` wraps `{loader.name}` before the loader can be prepared: accelerate changed "
                    f"nothing; make `{iterable.value}` where the training loop starts, then run accelerate again",
                )

    def _check_returned_loader(self, loader) -> None:
        """A training loader another module builds: whether it shuffles is not seen here, so the main process
        iterates it, in the original's order either way, and sends each process its slice of every batch."""
        self._dispatch_unread(loader.call, self.returned_loaders)

    def _dispatch_unread(self, call: cst.Call, kind: list) -> None:
        """A training loader whose settings are not read here (made by another module, or by a function of the
        file): dispatched from the main process, with the note on its last batch."""
        kind.append(call)
        self.plan.notes.append((call, "AM811", "on N processes a last batch smaller than the batch size is completed with the epoch's first samples (accelerate's even batches); `drop_last=True` where the loader is made, or a data set the batch size divides, keeps the original's steps"))

    def _dataloader_call(self, loader) -> Optional[cst.Call]:
        """The DataLoader(...) call that makes a training loader: its own value, or the one in the function of the
        file whose call it is bound to."""
        call = loader.value
        if not isinstance(call, cst.Call):
            return None
        return call if self.script.is_dataloader(call) else self.script.dataloader_made_by(call)

    def _check_loader_made_by_a_function(self, loader) -> None:
        """`train_loader = get_data_loader(train_data, batch_size, shuffle=True)`, a function of the file: its
        settings come through its parameters, so, as for a loader another module builds, the main process iterates
        it, in the original's order either way, and sends each process its slice of every batch. A name passed to
        it and shaping a tensor in the loop (`x.view(batch_size, -1)`) may be the batch size, now split."""
        call = loader.value
        passed = {dotted_name(a.value) for a in call.args if isinstance(a.value, (cst.Name, cst.Attribute))}
        for loop in (loop for step in self.steps for loop in step.loops if self.loader_of(loop) is loader):
            for node in walk(loop.node.body) if isinstance(loop.node, cst.For) else ():
                if self.parity and isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node) in passed and is_shape_argument(self.codemod, node):
                    raise CannotMigrate(node, "AM829", f"`{code_of(node)}`, passed to `{code_of(call.func)}` that makes the training DataLoader, shapes a tensor in the loop: if it is the batch size, each process now holds a share of it: accelerate changed nothing; shape it from the batch itself (`x.size(0)`), then run accelerate again")
        self._dispatch_unread(call, self.factory_loaders)

    def _check_loader(self, loader) -> None:
        call = loader.value
        if isinstance(call, cst.Call) and not self.script.is_dataloader(call) and self.script.dataloader_made_by(call) is not None:
            return self._check_loader_made_by_a_function(loader)
        if not isinstance(call, cst.Call) or not self.script.is_dataloader(call):
            raise CannotMigrate(loader.at, "AM829", f"training DataLoader `{loader.name}` not made by a DataLoader(...) call here: accelerate changed nothing")
        settings = self._loader_settings(call)
        sizes = settings.get("batch_size", [])
        if self.parity and "batch_sampler" not in settings and (not sizes or any(isinstance(s, cst.Integer) and int(s.value) == 1 for s in sizes)):
            raise CannotMigrate(call, "AM829", "training DataLoader with a batch of one: the processes cannot split it; give it a batch size that the number of processes divides, then run accelerate again")
        shuffled = any(not (isinstance(s, cst.Name) and s.value == "False") for s in settings.get("shuffle", []))
        # A sampler of the script's own (RandomSampler) is reseeded by `prepare` just as `shuffle=True` is.
        if shuffled or "sampler" in settings:
            self.shuffled_loaders.append(call)
        drop_last = settings.get("drop_last", [])
        if not drop_last or not all(isinstance(d, cst.Name) and d.value == "True" for d in drop_last):
            self.plan.notes.append((call, "AM811", "on N processes a last batch smaller than the batch size is completed with the epoch's first samples (accelerate's even batches); `drop_last=True`, or a data set the batch size divides, keeps the original's steps"))

    def _plan_local_batch_shapes(self, steps) -> None:
        """The training loop's tensors shaped with the loader's batch size
        (`x.view(batch_size, -1)`, `torch.zeros(batch_size, 1)`): each process
        now holds its share of every batch, so those sizes read
        `batch_size // accelerator.num_processes` (`prepare` refuses a batch
        the processes do not divide). By default each process loads the loader's batch size: nothing to change."""
        for step in steps if self.parity else ():
            for loop in step.loops or step.called_in_loops:
                if loop.loader is None or not isinstance(loop.node, cst.For) or not self.script.is_dataloader(loop.loader.value):
                    continue  # a loader a function makes: refused above where its arguments shape a tensor
                sizes = self._loader_settings(loop.loader.value).get("batch_size", [])
                size = dotted_name(sizes[0]) if len(sizes) == 1 else None
                if not size or self._binds(loop.node, size):
                    continue
                for node in walk(loop.node.body):
                    if (
                        isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node) == size and node not in self.plan.edits
                        and (not isinstance(node, cst.Name) or self.uses.is_read(node)) and is_shape_argument(self.codemod, node)
                    ):
                        self.plan.edit(node, lambda updated: cst.BinaryOperation(updated, cst.FloorDivide(), expression(f"{ACCELERATOR}.num_processes")))
                        self.plan.fixes.append((node, "AM832", f"`{size} // {ACCELERATOR}.num_processes`: each process holds its share of the batch of `{size}` that the loader now splits"))

    # A running total of a training loop, combined across the processes (totals.py).
    combined_total = staticmethod(accelerator_combined)

    @staticmethod
    def _binds(loop: cst.For, name: str) -> bool:
        """The loop binds `name` itself (`for batch_size in ...`, `batch_size = ...`)."""
        targets = [loop.target] + [t.target for n in walk(loop) if isinstance(n, cst.Assign) for t in n.targets]
        targets += [n.target for n in walk(loop) if isinstance(n, (cst.AugAssign, cst.For))]
        return any(isinstance(t, (cst.Name, cst.Attribute)) and dotted_name(t) == name for target in targets for t in walk(target))

    def _loader_settings(self, call: cst.Call) -> dict:
        """keyword -> the values a DataLoader call may get for it: its own arguments, and every value its `**kwargs`
        dict may hold (the examples' `DataLoader(dataset, **train_kwargs)`, updated with CUDA settings)."""
        settings = {a.keyword.value: [a.value] for a in call.args if a.keyword is not None}
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if len(positional) >= 2:
            settings.setdefault("batch_size", [positional[1].value])
        if has_star_args(call):
            seen = workers_facts(self.script).kwargs_dict(call, self.script.is_dataloader)
            if isinstance(seen, str):
                raise CannotMigrate(call, "AM829", f"training DataLoader with `**` arguments whose keys cannot be seen ({seen}): accelerate changed nothing")
            for entry in seen.entries:
                settings.setdefault(entry.key, []).append(entry.value)
        return settings

    # -- backward and clipping -------------------------------------------------------------

    def _plan_backward(self, steps) -> None:
        for step in steps:
            call = step.backward
            if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward") or call.args:
                raise CannotMigrate(call, "AM828", f"`{code_of(call)}`: accelerate changed nothing; write it as `loss.backward()` (one backward per forward, without `retain_graph`), then run accelerate again")
            loss = self._unscaled(call.func.value)
            # apex's `scaled_loss.backward()`: the reduction of the loss its block scales.
            reduction = backward_reduction(self.script, call) if loss is call.func.value else loss_reduction(self.script, loss)
            if reduction not in (MEAN, SUM, None):
                raise CannotMigrate(call, "AM823", "a loss whose reduction over the batch cannot be read: accelerate changed nothing; DDP averages the processes' gradients, which is the original's gradient for a mean over the batch only")
            times = f" * {ACCELERATOR}.num_processes" if reduction == SUM else ""

            def edit(updated, times=times):
                value = self._unscaled(updated.func.value)
                if times:
                    value = cst.BinaryOperation(left=value, operator=cst.Multiply(), right=expression(f"{ACCELERATOR}.num_processes"))
                return accelerator_call("backward", [cst.Arg(value=value)])

            self.plan.edit(call, edit)
            why = " times the number of processes: the loss sums over the batch, and DDP averages the processes' sums" if times else ""
            self.plan.fixes.append((call, "AM804", f"`{ACCELERATOR}.backward({code_of(loss)}{times})`{why}"))

    def _unscaled(self, operand: cst.BaseExpression) -> cst.BaseExpression:
        """`loss` for `scaler.scale(loss)` or apex's `scaled_loss`, the scaling Precision removes."""
        return self.precision.unscaled(operand)

    def _plan_clipping(self) -> None:
        for call in self._calls(CLIP_GRAD_FUNCTIONS):
            method = CLIP_METHODS[dotted_name(call.func).rsplit(".", 1)[-1]]
            if self._left_alone(call):
                continue
            if not self.in_entry(call):
                raise CannotMigrate(call, "AM805", f"gradient clipping outside the entry point: accelerate changed nothing; call `{ACCELERATOR}.{method}(...)` there by hand")
            self.plan.edit(call, lambda updated, method=method: accelerator_call(method, updated.args))
            self.plan.fixes.append((call, "AM805", f"`{ACCELERATOR}.{method}(...)`: clips the gradients the processes share"))

    # -- the model behind DDP's wrapper ----------------------------------------------------

    def _plan_model_attributes(self, prepared: set) -> None:
        entities = {e for step in self.steps for e in step.models}
        for name in self.uses.names:
            for node in self.uses.names[name]:
                parent = self.codemod.parent(node)
                if not (isinstance(parent, cst.Attribute) and parent.value is node and self.uses.is_read(node)):
                    continue
                if self._in_entry_itself(node):
                    if name not in prepared or self._before_prepare(node):
                        if parent.attr.value == "module" and self._had_data_parallel():
                            self.plan.edit(parent, lambda updated: updated.value)
                        continue
                elif name == "self" and isinstance(self.codemod.parent(parent), cst.Attribute) and self.codemod.parent(parent).value is parent:
                    if entities.intersection(self.script.entities_of(parent)):  # `self.model.state_dict()`
                        self._plan_attribute(parent, self.codemod.parent(parent))
                    continue
                elif not entities.intersection(self.script.entities_of(node)):
                    continue
                self._plan_attribute(node, parent)

    def _plan_attribute(self, node: cst.Name | cst.Attribute, attribute: cst.Attribute) -> None:
        attr, model = attribute.attr.value, code_of(node)
        if attr in WRAPPER_SAFE:
            return
        if not self.in_entry(node):
            raise CannotMigrate(attribute, "AM824", f"`{code_of(attribute)}` outside the entry point: DDP's wrapper hides the model's own attributes there; accelerate changed nothing; pass `{ACCELERATOR}.unwrap_model({model})` to that function, then run accelerate again")
        if attr == "module":
            self.plan.edit(attribute, lambda updated: unwrapped(updated.value))
        elif attr in THROUGH_UNWRAP or not self.codemod.innermost_loop(node):
            self.plan.edit(attribute, lambda updated: updated.with_changes(value=unwrapped(updated.value)))
        else:
            raise CannotMigrate(attribute, "AM824", f"`{code_of(attribute)}` while training: a model trained through its own methods skips DDP's gradient synchronisation; accelerate changed nothing; train it through `{model}(...)`")
        self.plan.fixes.append((attribute, "AM809", f"`{ACCELERATOR}.unwrap_model({model})`: the bare model: DDP's wrapper hides its own attributes, and its state_dict keys carry no `module.`"))

    def _before_prepare(self, node: cst.CSTNode) -> bool:
        top = self.top_statement(node)
        return top is not None and self.body.index(top) <= self.prepared_at

    def _had_data_parallel(self) -> bool:
        """`model.module` before `prepare` reads the DataParallel the migration removes."""
        return bool(self._calls(v.DATA_PARALLEL))

    # -- output -------------------------------------------------------------------------

    def _plan_output(self) -> None:
        saves = self._calls(v.TORCH_SAVE)
        writes = [c for c in self.uses.calls if self._opens_for_writing(c)]
        guarded = []
        for call in saves + writes:
            if self._left_alone(call):
                continue
            if not self.in_entry(call):
                raise CannotMigrate(call, "AM826", f"`{code_of(call.func)}(...)` outside the entry point writes on every process: accelerate changed nothing; write under `if {ACCELERATOR}.is_main_process:` in the entry point, then run accelerate again")
            line = self._own_statement(call)
            if line is None:
                raise CannotMigrate(call, "AM826", f"`{code_of(call.func)}(...)` inside a larger statement: accelerate changed nothing; give it a line of its own, then run accelerate again")
            if call in writes and isinstance(line, cst.SimpleStatementLine) and not isinstance(line.body[0], cst.Expr):
                # `log = open(path, "w")` under the guard leaves `log` unbound on the other processes, which use it.
                raise CannotMigrate(call, "AM826", f"`{code_of(line.body[0])}` binds a file that only the main process would open, and the other processes would still use the name: accelerate changed nothing; write within `with open(...) as f:` blocks (or open it on the main process and guard each use) by hand, then run accelerate again")
            if self.codemod.is_suppressed(line, "AM808"):
                continue
            if call in saves:
                self.plan.edit(call, lambda updated: accelerator_call("save", updated.args))
            self.plan.guarded.add(line)
            guarded.append(line)
            self.plan.fixes.append((call, "AM808", f"written by the main process only (`if {ACCELERATOR}.is_main_process:`)" + (f", through `{ACCELERATOR}.save`" if call in saves else "")))
        guarded += self._plan_helper_writes()
        reads = self._calls(v.TORCH_LOAD)
        if guarded and reads:
            raise CannotMigrate(reads[0], "AM826", f"a file read back where the main process alone now writes: accelerate changed nothing; add `{ACCELERATOR}.wait_for_everyone()` between the write and the read by hand")
        printed = 0
        for call in self._calls({"builtins.print"}):
            if self.in_entry(call):
                self.plan.edit(call, lambda updated: accelerator_call("print", updated.args))
                printed += 1
                if printed == 1:
                    self.plan.fixes.append((call, "AM807", f"`{ACCELERATOR}.print(...)`: printed once, by the main process"))
            elif self.script.scope_of(call).kind != "module" and not self._left_alone(call):
                function = self.script.flow.function_of(self.script.scope_of(call))
                why = f" ({self.functions.why_not(function)})" if function is not None and self.functions.why_not(function) else ""
                raise CannotMigrate(call, "AM826", f"`print(...)` in a function the entry point may call on every process{why}: accelerate changed nothing; return what it prints and print it in the entry point, or print with `{ACCELERATOR}.print` passed in")

        self._plan_logging()

    def _plan_helper_writes(self) -> list:
        """A call of another module's function that writes a file (the project fact `rank_zero_writers`:
        `utils.save_model(model=model, target_dir=...)`), on a line of its own in the entry point: run by the main
        process alone, given the bare model. An instance of such a class (an early stopper saving the best
        weights) decides on every process: refused."""
        writers = project_facts.current().rank_zero_writers if self.codemod.reads_handoffs else frozenset()
        guarded = []
        for call in self.uses.calls if writers else ():
            root = call.func.value if isinstance(call.func, cst.Attribute) else call.func
            made = [b.value for b in self.script.bindings_of(root.value, root)] if isinstance(root, cst.Name) else []
            if any(isinstance(m, cst.Call) and self.codemod.qualified_names(m.func) & writers for m in made):
                raise CannotMigrate(call, "AM826", f"`{code_of(call.func)}(...)` writes a file in another module of the project on every process, and decides on each: accelerate changed nothing; write under `if {ACCELERATOR}.is_main_process:` there by hand, then run accelerate again")
            if not self.codemod.qualified_names(call.func) & writers or self._left_alone(call):
                continue
            line = self._own_statement(call)
            if not (self.in_entry(call) and isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[0], cst.Expr) and line.body[0].value is call):
                raise CannotMigrate(call, "AM826", f"`{code_of(call.func)}(...)` writes a file in another module of the project on every process: accelerate changed nothing; call it on a line of its own in the entry point, then run accelerate again")
            for argument in call.args:
                if isinstance(argument.value, cst.Name) and argument.value.value in self.model_names and not self._before_prepare(call):
                    self.plan.edit(argument.value, self._bare_model)
            self.plan.guarded.add(line)
            guarded.append(line)
            self.plan.fixes.append((call, "AM808", f"written by the main process only (`if {ACCELERATOR}.is_main_process:`), given the bare model"))
        return guarded

    # The model a helper of another module is given to save: `accelerator.unwrap_model(model)`.
    _bare_model = staticmethod(unwrapped)

    def _plan_logging(self) -> None:
        """A logging call on a line of its own in the entry point (or a
        function it passes the accelerator to) logs on the main process only,
        as `accelerator.print` prints: the logging module's functions, and a
        logger made by `logging.getLogger` here or bound in a module of the
        project (ddp's `loggers` fact)."""
        logged = 0
        for call in self.uses.calls:
            if not self._logs(call) or not self.in_entry(call):
                continue
            line = self._own_statement(call)
            if not isinstance(line, cst.SimpleStatementLine) or not isinstance(line.body[0], cst.Expr) or line.body[0].value is not call:
                continue
            if line in self.plan.guarded or self.codemod.is_suppressed(line, "AM807"):
                continue
            self.plan.guarded.add(line)
            logged += 1
            if logged == 1:
                self.plan.fixes.append((call, "AM807", f"logged by the main process only (`if {ACCELERATOR}.is_main_process:`)"))

    def _logs(self, call: cst.Call) -> bool:
        if self.codemod.is_call_to(call, v.LOGGING_CALLS):
            return True
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in v.LOG_LEVELS and isinstance(func.value, cst.Name)):
            return False
        if self.codemod.qualified_names(func.value) & self.script.project.loggers:
            return True
        bound = self.script.bindings_of(func.value.value, func.value)
        return bool(bound) and all(
            b.kind == "assign" and isinstance(b.value, cst.Call) and self.codemod.is_call_to(b.value, {"logging.getLogger"}) for b in bound
        )

    def _opens_for_writing(self, call: cst.Call) -> bool:
        if not self.codemod.is_call_to(call, {"builtins.open"}):
            return False
        mode = keyword_arg(call, "mode") or (call.args[1] if len(call.args) > 1 and call.args[1].keyword is None else None)
        return mode is not None and isinstance(mode.value, cst.SimpleString) and any(m in mode.value.evaluated_value for m in WRITE_MODES)

    def _own_statement(self, call: cst.Call) -> cst.CSTNode | None:
        """The statement that holds `call` and nothing that must run on every process: a line of its own, or a
        `with open(...)` block."""
        for ancestor in self.codemod.ancestors(call):
            if isinstance(ancestor, cst.SimpleStatementLine):
                return ancestor if len(ancestor.body) == 1 and isinstance(self.codemod.parent(ancestor), (cst.IndentedBlock, cst.Module)) else None
            if isinstance(ancestor, cst.With):
                return ancestor if isinstance(self.codemod.parent(ancestor), (cst.IndentedBlock, cst.Module)) else None
            if isinstance(ancestor, (cst.BaseCompoundStatement, cst.FunctionDef)):
                return None
        return None


def _parsed_argument(target: cst.CSTNode) -> bool:
    """`args.device`: an attribute of a plain name (the parsed arguments, a config namespace)."""
    return isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)
