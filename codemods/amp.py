"""amp: train and evaluate in 16-bit mixed precision with `torch.autocast`.

What it does
    For every training step it can prove (a `loss.backward()` and the
    `step()` of an optimizer built from `torch.optim` in the same loop or
    function, the loss computed before the backward in that loop or function):

    - wraps the forward pass and the loss computation in
      `torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=...)`;
      the backward pass and the optimizer step stay outside;
    - scales the loss with a `torch.amp.GradScaler`: `scaler.scale(loss).backward()`,
      `scaler.step(optimizer)` for every optimizer, one `scaler.update()` per
      iteration, and `scaler.unscale_(optimizer)` before the gradients are
      clipped or read;
    - binds `amp_dtype = autocast_dtype(device)` after the device binding and
      `scaler = grad_scaler(device, amp_dtype)` after the optimizer (in a
      class: `self.amp_dtype`, `self.scaler`), where it runs on every path to
      the code that reads it: after the `if args.use_optimizer:` that builds
      the optimizer when the step reads the scaler outside it, and before
      the first call of a training function that reads it (a notebook that
      trains one model and then another gets it after the first optimizer,
      and both share it). The runtime picks bfloat16 on
      GPUs that compute it, else float16, and float32 (autocast off) on a
      CPU; `ACCELMIGRATE_PRECISION=bf16|fp16|fp32` overrides it (fp32 turns
      autocast off through `enabled=`). The scaler is enabled only for
      float16, so the same code runs in every precision;
    - runs evaluation (`with torch.no_grad():`, `torch.inference_mode()`, and
      functions decorated with them) under the same autocast, without a scaler;
    - saves the scaler's state next to the optimizer's in checkpoints
      (`{"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}`)
      and loads it back after `optimizer.load_state_dict(ckpt["optimizer"])`;
    - migrates NVIDIA apex (`amp.initialize`, `amp.scale_loss`,
      `amp.master_params`, `amp.state_dict`) to the native API and drops the
      apex import;
    - replaces the deprecated `torch.cuda.amp.autocast`, `GradScaler`,
      `custom_fwd`, `custom_bwd` (and `torch.cpu.amp`), however imported. With
      a device binding in reach of every old autocast and GradScaler, they
      move onto the same policy as the rest: `torch.autocast(device_type=
      device.type, dtype=amp_dtype, enabled=...)` (the user's own `enabled=`
      kept in the condition) and `grad_scaler(device, amp_dtype, ...)` (its
      options kept), so the scaler is on only for float16 and
      ACCELMIGRATE_PRECISION applies. All of them or none: when one is out of
      reach, suppressed, or names a dtype other than float16 (the user's
      choice), every one becomes its `torch.amp` form on the device it named,
      in the precision as written, and the finding says so.

    The names it adds mean what it means in every scope that reads them:
    the runtime's functions are imported as `accelmigrate_<name>` where the
    script binds the name anywhere (`grad_scaler = torch.cuda.amp.GradScaler()`
    in a function becomes `grad_scaler = accelmigrate_grad_scaler(...)`), and
    `amp_dtype` and `scaler` give way to `autocast_dtype_` and `amp_scaler`
    where the scope that would bind them, or one nested in it, binds them.

    The autocast device comes from the device binding the `device` codemod
    leaves (`device = get_device()`), any `device = torch.device(...)` or
    `torch.accelerator.current_accelerator()`, the device of a model's
    parameters (`device = next(model.parameters()).device`), the same bound
    to `args.device` or to `self.device` (also `self.device = device` from a
    parameter), or a `device` (or `args`) parameter of a function that every
    call in the file passes such a device (followed through the calls:
    `def train(args, model, device, train_loader, optimizer, epoch)`). There
    `amp_dtype = autocast_dtype(device)` becomes the function's first
    statement; when the function receives its optimizer too, the scaler is
    bound in the caller next to the optimizer and handed in as a new `scaler`
    parameter (`train(..., epoch, scaler=scaler)`), so one scaler keeps its
    loss scale from one call to the next (a function called both with its
    optimizer and without it, `run_epoch(..., optimizer=None)`, gets
    `scaler=None` and the scaler only where the optimizer is passed, when
    each backward there is followed by the optimizer's step in its block).
    A function that receives an optimizer built where the codemod cannot
    see (a module of the project calls `engine.train_fn(model, loader,
    optimizer, device)`, a trainer keeps one from a factory in
    `self.optimizer`) takes the optimizer's own scaler instead:
    `scaler = scaler_for(optimizer, device, amp_dtype)` at its top, the same
    GradScaler in every call, so its loss scale carries over as well.
    A device string is a device too (`device = "cuda" if ... else "cpu"`,
    `device = args.device` of a `--device` flag, `self.device`, and
    `config["device"]` of a module-level config dict that nothing changes):
    the user's string is kept where it is compared or printed, the dtype
    and the scaler are given the string, and autocast reads
    `torch.device(device).type`. With no device bound in reach, the code
    computes where the one model it calls is: where that model is bound
    once and never moved afterwards (`.cuda(args.gpu)` where it is built,
    a `cfg.device` of a config object), `device = next(model.parameters())
    .device` is bound right after it (in a function handed the model, such
    as `evaluate(model, loader)`, as its first statement). A script that never names a device
    (no `.to(...)`, `.cuda()`, `device=`, `torch.cuda`, device parameter or
    flag) computes on the CPU: it gets `torch.autocast(device_type="cpu", ...)`
    and `amp_dtype = autocast_dtype("cpu")` after its imports, float32 (the
    original's numbers) unless ACCELMIGRATE_PRECISION=bf16.

    Autocast follows the device the computation is on, not the one a script
    names. A script that binds a device and moves nothing to it (PyTorch's
    CIFAR-10 tutorial: `device = torch.device("cuda:0" if ... else "cpu")`
    printed, `net = Net()` and its batches left on the CPU) computes on the
    CPU on every machine: autocast for CUDA there would wrap CPU work and
    change nothing, and a float16 scaler would scale gradients for a device
    that computes none. When every trained model is built in the file,
    nothing in the file places, names or asks for a device except that
    binding, and each read of it only prints, formats or compares it, the
    steps are keyed to the CPU as in a script that names no device (float32
    by default, the original's numbers), and AM401 says how to move the
    model and batches to the device instead. A model received from code out
    of view (a parameter no call in the file sets) may be anywhere, so the
    device binding is kept then.

    Values computed under an autocast it adds that reach numpy (`.numpy()`,
    and numpy, scikit-learn, matplotlib, scipy or pandas calls given such a
    tensor) pass through `full_precision(...)` (accelmigrate.runtime.precision),
    which casts float16/bfloat16 tensors back to float32: numpy has no
    bfloat16. They are followed through assignments, lists they are appended
    to, and the parameters and return values of the file's functions.
    `.item()` and `.tolist()` read bfloat16 fine and are left alone.

Why float32 on a CPU by default
    CPU autocast keeps far fewer operations in float32 than CUDA's does:
    softmax, log_softmax, sum, cumsum, layer_norm, group_norm, exp, log and
    pow run in bfloat16 there (CUDA runs them in float32). bfloat16 is slower
    than float32 on CPUs without bfloat16 units, and 1.2-1.7x faster on small
    conv nets where the CPU has them. A migrated script run on a CPU is mostly
    a check that it still trains as before, so it computes what the original
    computed; `ACCELMIGRATE_PRECISION=bf16` opts in to bfloat16 there. (A
    BatchNorm conv net with a one-cycle schedule peaking at 0.2 ended 93% ->
    42% once in bfloat16; measured over 96 paired runs of such nets, bfloat16
    stayed within float32's own spread across seeds, so the drop is that of a
    schedule whose outcome any rounding can tip, not of one operation.)

Why
    Tensor cores compute matrix products in 16 bits several times faster than
    in 32, and activations in 16 bits halve the memory traffic. Autocast runs
    each operation in the precision that is safe for it (matmuls and
    convolutions in 16 bits, reductions and losses in 32), so the model's
    parameters and the optimizer stay in float32. float16's narrow exponent
    range lets small gradients underflow to zero: the scaler multiplies the
    loss before the backward and divides the gradients before the step,
    skipping steps whose gradients overflowed. Gradients must be unscaled
    before they are clipped, or the threshold applies to scaled values.

Example
    Before::

        device = get_device()
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            output = model(x)
            loss = criterion(output, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()

    After::

        device = get_device()
        amp_dtype = autocast_dtype(device)
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = grad_scaler(device, amp_dtype)
        for x, y in loader:
            optimizer.zero_grad()
            with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
                output = model(x)
                loss = criterion(output, y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()

Left alone (with a finding that says what to do by hand)
    - a backward whose loss is not computed before it in the same loop or
      function (forward and backward in different functions, a loss passed in
      as a parameter: AM410), or computed in the backward statement itself
      (`criterion(model(x), y).backward()`: bind it first). A loss summed in
      a loop (a decoder unrolled step by step) takes the loop into the
      autocast region whole, unless the loop steps, returns, or jumps out
      of a loop around it;
    - gradients applied by hand (`p.data.add_(p.grad, alpha=-lr)`, no
      optimizer): the scaler unscales through an optimizer's step (AM410);
    - `backward()` with a gradient, `inputs=` or `create_graph=True`, and
      `torch.autograd.grad` in the step: gradient penalties and gradients
      read outside the optimizer need the scaler placed by hand (AM412);
      `retain_graph=` is kept: `scaler.scale(loss).backward(retain_graph=True)`
      for each of several losses, as in PyTorch's AMP examples;
    - `optimizer.step(closure)` (LBFGS): the loss is computed inside step() (AM411);
    - an optimizer the codemod cannot trace to its constructor nor to a
      parameter (or `self.<name>`) of the stepping function that it never
      rebinds (a factory's result bound in the function; a function with
      starred or keyword-only parameters, where a new `scaler` parameter
      cannot go; one that a caller leaves None while the backward still
      runs; several such optimizers in one function), or any
      `.step()` in the step whose receiver the script treats as an optimizer
      (built from a model or its parameters, zeroed with `.zero_grad()`, its
      `param_groups` read, handed to a scheduler, or an instance of a class of
      the file with an unknown base whose `step` takes no argument): a step
      that bypassed the scaler would apply scaled gradients (AM414). Other
      untraced receivers of `.step()` are no optimizers and are left alone: a
      gym environment's `envs.step(actions)`, a scheduler from a factory;
    - gradients read on a path where no optimizer steps (`if
      args.use_optimizer: optimizer.step()` and a hand-written update under
      `else:`): with float16 they would carry the loss scale (AM415);
    - no device binding in reach (AM413: a device string, a `device`
      parameter that no call in the file or in the project's files migrated
      with it sets), the device bound inside the loop, several optimizers
      stepped only in separate branches (AM415);
    - a binary cross-entropy on probabilities (`F.binary_cross_entropy`, an
      `nn.BCELoss` however it reaches the step) in the forward and loss, or
      in an evaluation, on a device that may be CUDA: CUDA autocast refuses
      it (AM418; `nn.BCEWithLogitsLoss` on the logits is the fix);
    - apex as a whole when one of its uses has no native equivalent
      (`amp.register_float_function`, ...: AM416).

    A fill constant that float16 cannot hold (`scores.masked_fill(mask ==
    0, -1e9)` in attention) raises under float16 autocast: where amp adds
    autocast to the file, and in the methods of the file's nn.Module
    classes, it becomes `torch.finfo(scores.dtype).min` (AM419), which
    masks alike after a softmax in every dtype; a fill of an unnamed value
    (a call's result) is a finding.

    Notes (`check --show-notes`): AM405, AM406 and AM407 say what a
    migration does alongside AM401 (the scaler's state in checkpoints,
    unscaling before clipping, casts back for numpy: one AM407 per file).

    Steps that already run under autocast or scale their loss (a previous
    run, or the user's own native AMP) are left as they are, with the note
    AM408, and so are no_grad blocks that only update parameters in place
    (an EMA).

    Across the project: a function of the file that another file of the
    project calls with a device (`fit(model, device=device)` in `train.py`)
    reads its device type as `torch.device(device).type`; gradients clipped
    or read through a function of the project (this file's or an imported
    module's) between the backward and the step are unscaled first.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ._amp.apex import Apex
from ._amp.bindings import Bindings
from ._amp.checkpoints import Checkpoints
from ._amp.deprecated import DeprecatedApi
from ._amp.edits import AppliesEdits, Edits
from ._amp.evaluation import Evaluation
from ._amp.introduced import Introduced
from ._amp.leaving import Leaving
from ._amp.masks import MaskConstants
from ._amp.names import Resolution
from ._amp.passed import Passed
from ._amp.received import Received
from ._amp.placement import UNUSED_DEVICE, Placement
from ._amp.plan import (
    CPU, RAW_AUTOGRAD, Backward, Problem, Ref, StepPlan, method_call, statement, unscalable_argument, without_parens,
)
from ._amp.regions import Regions
from ._base import Codemod, code_of, walk
from .script.amp_facts import amp_facts


class Amp(Bindings, Passed, Received, Regions, Apex, Evaluation, Checkpoints, DeprecatedApi, Leaving, MaskConstants, Introduced, Placement, Resolution, AppliesEdits, Codemod):
    word = "amp"
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    summary = "mixed precision: torch.autocast around forward and loss, a GradScaler for fp16; apex and torch.cuda.amp migrated"
    requires = ("device",)
    codes = {
        "AM401": "training step in full precision: no torch.autocast around its forward, no GradScaler",
        "AM402": "evaluation under no_grad without torch.autocast",
        "AM403": "NVIDIA apex amp, which torch.amp replaces",
        "AM404": "deprecated torch.cuda.amp / torch.cpu.amp API",
        "AM405": "checkpoint that needs the GradScaler's state next to the optimizer's",
        "AM406": "gradients clipped or read, which need scaler.unscale_() first",
        "AM407": "values computed under autocast that reach numpy or an image writer, which have no bfloat16",
        "AM408": "training step in mixed precision already (its own torch.autocast or GradScaler): left as it is",
        "AM410": "backward whose forward, loss or step is out of view: add autocast and a GradScaler by hand",
        "AM411": "optimizer.step(closure): add autocast and a GradScaler by hand",
        "AM412": "backward with a gradient, inputs= or create_graph=, or raw autograd calls: scale the loss by hand",
        "AM413": "no device in reach: autocast needs the device type",
        "AM414": "optimizer not traceable to its constructor: bind the GradScaler by hand",
        "AM415": "training step laid out in a way the codemod cannot rewrite safely: migrate it by hand",
        "AM416": "apex usage without a native equivalent: apex left in place",
        "AM417": "checkpoint that saves the optimizer but not the GradScaler",
        "AM418": "loss that torch refuses under autocast (binary cross-entropy on probabilities)",
        "AM419": "fill constant that float16 cannot hold (`masked_fill(mask, -1e9)`)",
    }
    # What a migration does alongside AM401 (the scaler's state in checkpoints,
    # unscaling before clipping, casts back for numpy), and a step it leaves
    # in the mixed precision it has already (so that amp never changes
    # nothing without a word): nothing to act on.
    notes = frozenset({"AM405", "AM406", "AM407", "AM408"})
    # Every spelling of what this codemod matches contains one of these: a
    # training step ("backward"), an evaluation block, or the old AMP APIs,
    # which are reached through `.amp`, apex, or one of their names; a fill
    # that float16 cannot hold (a model module's `masked_fill`).
    triggers = (
        "backward", "no_grad", "inference_mode",
        ".amp", "apex", "autocast", "GradScaler", "custom_fwd", "custom_bwd", "masked_fill",
    )


    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.edits = Edits()
        self.torch = "torch"
        self.devices: dict = {}  # device Ref key -> Ref
        self.dtype_bindings: dict = {}  # device Ref key -> Binding
        self.scaler_bindings: dict = {}  # (kind, id(home)) of the optimizers -> Binding
        self.apex_edits: list = []  # ApexEdits, committed together or not at all
        self.passed: dict = {}  # parameter Ref key -> (Function, [(call, the Ref its caller passes)])
        self.caller_devices: dict = {}  # a caller's scaler key -> the device in reach there
        self.autocast_spans: list = []  # statements and `with` blocks the edits run under autocast
        self.casts_to_numpy: list = []  # `.numpy()` and numpy-reading calls given full_precision(...)
        self.resolving: set = set()  # assignment lines whose device is being resolved (against cycles)
        self.runtime_names: dict = {}  # runtime function -> the name the migrated code calls it by
        self.unused_devices: dict = {}  # device Ref key -> nothing is placed on it (the steps run on the CPU)
        self.model_devices: dict = {}  # device Ref key -> (the model's line, `device = next(model.parameters()).device`)
        self.optimizer_uses: Optional[dict] = None  # see Resolution.used_as_optimizer

    # =========================================================================
    # planning: everything is decided on the original tree, before any change
    # =========================================================================

    def visit_Module(self, node: cst.Module) -> bool:
        self.tree = node
        self.facts = amp_facts(self.script)
        self.torch = self.torch_alias()
        plans = self.plan_scalers(self.plan_steps())
        plans = self.plan_apex(plans)
        for plan in plans:
            self.commit_step(plan)
        self.commit_apex()
        self.plan_evaluation()
        self.plan_checkpoints(plans)
        self.plan_deprecated()
        self.plan_leaving()
        self.plan_masks()
        self.commit_bindings()
        return True

    # =========================================================================
    # training steps
    # =========================================================================

    def plan_steps(self) -> list:
        """A StepPlan for each training step that can be migrated; a finding
        for each that cannot."""
        units: dict = {}
        for backward in self.backwards():
            units.setdefault(self.training_unit(backward.statement), []).append(backward)
        plans = []
        for unit, backwards in units.items():
            if any(self.is_scaled(b) for b in backwards) or self.runs_under_autocast(backwards[0].statement):
                # mixed precision already (a previous run, or the user's own)
                self.report(backwards[0].call or backwards[0].statement, "AM408", "this training step runs in mixed precision already (torch.autocast, a GradScaler): amp left it as it is")
                continue
            try:
                plan = self.plan_step(unit, backwards)
            except Problem as problem:
                self.report(problem.node, problem.code, problem.message)
                continue
            if plan is not None and not self.is_step_suppressed(plan):
                plans.append(plan)
        return plans

    def is_step_suppressed(self, plan: StepPlan) -> bool:
        nodes = [(b.call or b.statement, "AM401") for b in plan.backwards] + [(user, "AM406") for _, _, user in plan.unscales]
        return any(self.is_suppressed(node, code) for node, code in nodes)

    def backwards(self) -> list:
        """Each `loss.backward()`, and each `with amp.scale_loss(loss, optimizer) as scaled:` of apex."""
        found, inside_apex = [], set()
        for with_node in self.apex_scale_loss_blocks():
            scale_loss = self.apex_scale_loss(with_node)
            loss = scale_loss.args[0].value if scale_loss.args and not scale_loss.args[0].keyword else None
            found.append(Backward(with_node, None, loss, with_node))
            inside_apex.update(walk(with_node.body, into_definitions=False))
        for step in self.script.training_steps:
            call = step.backward
            if method_call(call, "backward") and call not in inside_apex:
                found.append(Backward(self.line_of(call), call, call.func.value))
        return sorted((b for b in found if b.statement is not None), key=lambda b: self.order(b.statement))

    def training_unit(self, line: cst.BaseStatement) -> cst.CSTNode:
        """The backward's loop, or the loop around it when only that one steps
        (micro-batches accumulated in an inner loop)."""
        unit = self.unit_of(line)
        if isinstance(unit, (cst.For, cst.While)) and not self.steps_directly_in(unit):
            outer = self.unit_of(unit)
            if self.steps_directly_in(outer):
                return outer
        return unit

    def steps_directly_in(self, unit: cst.CSTNode) -> bool:
        return any(method_call(c, "step") and self.unit_of(c) is unit for c in self.calls_within(unit))

    def is_scaled(self, backward: Backward) -> bool:
        """`scaler.scale(loss).backward()`: a previous run, or native AMP."""
        return backward.call is not None and method_call(backward.loss, "scale")

    def plan_step(self, unit: cst.CSTNode, backwards: list) -> Optional[StepPlan]:
        first = backwards[0].call or backwards[0].statement
        self.check_backwards(unit, backwards)
        device = self.device_at(backwards[0].statement)
        if device is None:
            raise Problem(first, "AM413", "no device binding in reach of this training step (autocast needs device.type): bind `device = torch.device(\"cuda\" if torch.cuda.is_available() else \"cpu\")`, move the model and the batches there with `.to(device)`, and run again (`--to device` does it for a script written for CUDA)")
        regions = []
        for backward in backwards:
            region = self.region_for(backward)
            if region is None:
                return None  # the user's own autocast computes this loss
            regions.append(region)
        regions = self.merged(regions)
        self.check_regions(regions, device)
        steps = self.optimizer_steps(unit, backwards)
        optimizers: list = []
        for _, ref in steps:
            if all(ref.key != other.key for other in optimizers):
                optimizers.append(ref)
        return StepPlan(
            backwards=backwards,
            device=device,
            optimizers=optimizers,
            steps=steps,
            regions=regions,
            unscales=self.unscales(unit, backwards, steps),
            update_after=self.update_anchor(steps),
            site=backwards[0].statement,
        )

    def check_regions(self, regions: list, device: Ref) -> None:
        """The autocast header reads the device and the dtype: both must be
        bound before the region starts."""
        for region in regions:
            if self.device_at(region.first) is not device:
                raise Problem(region.first, "AM415", "the device is bound inside the forward pass: bind it before the loop, then run again")
            refused = self.refused_under_autocast(region) if device.kind != CPU else None  # CPU autocast computes it in float32
            if refused is not None:
                raise Problem(refused, "AM418", f"`{code_of(refused.func)}` computes a binary cross-entropy on probabilities, which torch refuses under autocast (CUDA autocast raises at the first step): use `nn.BCEWithLogitsLoss` on the logits (without the final sigmoid), then run amp again; or add autocast by hand, computing this loss in float32 after the autocast block (`criterion(out.float(), y)`)")
            region.header = self.autocast_text(device, region.first)

    def check_backwards(self, unit: cst.CSTNode, backwards: list) -> None:
        for backward in backwards:
            node = backward.call or backward.statement
            if backward.call is not None and self.own_line(backward.call) is None:
                raise Problem(node, "AM415", "put `loss.backward()` on a line of its own (not in a one-line block, not after `;`) so that it can be scaled")
            if backward.apex is not None:
                self.check_apex_with(backward)
            kept = unscalable_argument(backward.call) if backward.call is not None else None
            if kept is not None:
                named = f"`{kept.keyword.value}=`" if kept.keyword is not None else f"`{kept.star}{code_of(kept.value)}`" if kept.star else "a positional argument (the gradient)"
                raise Problem(node, "AM412", f"backward() with {named}: gradients given or read outside the optimizer would carry the loss scale; write `scaler.scale(loss).backward(...)` by hand and unscale what is read (PyTorch's AMP examples)")
            if self.computes_forward(backward.loss):
                raise Problem(node, "AM410", "the loss is computed in the backward statement itself: bind it first (`loss = criterion(model(x), y)`, then `loss.backward()`) and run again")
        for call in self.calls_within(unit):
            if self.is_call_to(call, RAW_AUTOGRAD):
                raise Problem(call, "AM412", "torch.autograd.grad/backward in the training step: a gradient penalty needs the scaled loss and unscaled gradients by hand (PyTorch's AMP examples, 'Gradient penalty')")

    def check_apex_with(self, backward: Backward) -> None:
        with_node = backward.apex
        body = with_node.body.body if isinstance(with_node.body, cst.IndentedBlock) else []
        target = with_node.items[0].asname.name if with_node.items[0].asname is not None else None
        sole = body[0].body[0] if len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1 else None
        call = sole.value if isinstance(sole, cst.Expr) else None
        if backward.loss is None or len(with_node.items) != 1 or not isinstance(target, cst.Name) or not method_call(call, "backward") or self.dotted(call.func.value) != target.value:
            raise Problem(with_node, "AM416", "amp.scale_loss() block other than `with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()`: replace it by `scaler.scale(loss).backward()` by hand")
        if unscalable_argument(call) is not None:
            raise Problem(with_node, "AM412", "scaled_loss.backward() with a gradient, inputs= or create_graph=: replace it by `scaler.scale(loss).backward(...)` by hand")

    def optimizer_steps(self, unit: cst.CSTNode, backwards: list) -> list:
        """(call, optimizer) for each `.step()` of the unit; a Problem when a
        `.step()` may belong to an optimizer the codemod cannot see."""
        first = backwards[0].call or backwards[0].statement
        steps = []
        for call in self.calls_within(unit):
            if not method_call(call, "step"):
                continue
            receiver = call.func.value
            ref = self.optimizer_of(receiver, call)
            if ref is None and (self.is_known_other(receiver, call) or not self.may_be_optimizer(receiver)):
                continue  # an environment, a scheduler: not stepped through the scaler
            if ref is None:
                ref = self.optimizer_received(receiver, call)
            if ref is None:
                raise Problem(first, "AM414", f"cannot trace `{code_of(receiver)}` (stepped in this training step) to a torch.optim constructor in reach, nor to a parameter of this function: bind `scaler = grad_scaler(device, amp_dtype)` next to the optimizer and scale by hand")
            if call.args:
                raise Problem(call, "AM411", "optimizer.step(closure) (LBFGS and the like) evaluates the loss inside step(): run the closure's forward under autocast and scale by hand, or keep this step in float32")
            if self.unit_of(call) is not unit or self.own_line(call) is None:
                raise Problem(call, "AM415", "put `optimizer.step()` on a line of its own, once per iteration of the training loop, so that scaler.update() can follow it")
            steps.append((call, ref))
        if not steps:
            self.check_closure(unit)
            if any(isinstance(user, cst.Attribute) for user in self.gradient_users(unit)):
                raise Problem(first, "AM410", "the gradients are applied by hand (`p.grad` read after this backward, no optimizer steps): a GradScaler unscales only through an optimizer's step; replace the update by a torch.optim optimizer (its lr in param_groups), or add autocast by hand and keep float32 gradients")
            raise Problem(first, "AM410", "no optimizer.step() in the same loop or function as this backward (forward, backward and step apart): add autocast and a GradScaler by hand")
        if not any(self.ends_before(backwards[0].statement, call) for call, _ in steps):
            raise Problem(first, "AM410", "the optimizer steps before this backward in the loop: add autocast and a GradScaler by hand")
        return steps

    def check_closure(self, unit: cst.CSTNode) -> None:
        """A backward in a closure handed to `optimizer.step(closure)`."""
        if not isinstance(unit, cst.FunctionDef):
            return
        for call in self.facts.calls:
            if method_call(call, "step") and any(isinstance(a.value, cst.Name) and a.value.value == unit.name.value for a in call.args):
                raise Problem(call, "AM411", "optimizer.step(closure) (LBFGS and the like) evaluates the loss inside step(): run the closure's forward under autocast and scale by hand, or keep this step in float32")

    # -- committing a step -------------------------------------------------------------

    def commit_step(self, plan: StepPlan) -> None:
        site = plan.site
        scaler_binding = self.scaler_of(plan)
        scaler = scaler_binding.text(self.owner_at(site))
        for region in plan.regions:
            self.edits.wrap[region.first] = (region.last, region.header)
            body = list(region.block.body)
            self.autocast_spans.extend(body[body.index(region.first): body.index(region.last) + 1])
        for backward in plan.backwards:
            self.scale_backward(backward, scaler)
        for call, _ in plan.steps:
            self.edits.replace[call] = lambda updated, scaler=scaler: cst.Call(func=cst.parse_expression(f"{scaler}.step"), args=[cst.Arg(updated.func.value)])
        for anchor, refs, user in plan.unscales:
            for ref in refs:
                self.edits.insert_before(anchor, statement(f"{scaler}.unscale_({self.optimizer_text(ref, anchor)})"))
            self.fix(user, "AM406", "scaler.unscale_(optimizer) first: clipping or reading the gradients must see their true values, not values multiplied by the loss scale")
        self.edits.insert_after(plan.update_after, statement(f"{scaler}.update()"))
        scaler_binding.used = True
        self.dtype_binding(plan.device).used = True
        self.import_runtime("autocast_dtype")
        self.import_runtime("scaler_for" if scaler_binding.value.startswith(self.runtime_name("scaler_for")) else "grad_scaler")
        self.need_torch()
        stepped = ", ".join(self.optimizer_text(ref, site) for ref in plan.optimizers)
        on_cpu = UNUSED_DEVICE if plan.device.kind == CPU and self.left_unused() else ""
        for backward in plan.backwards:
            self.fix(backward.call or backward.statement, "AM401", f"forward and loss under torch.autocast (bf16 on GPUs that support it, else fp16 with the GradScaler; fp32 on a CPU; ACCELMIGRATE_PRECISION overrides), backward scaled, {stepped} stepped through the scaler{on_cpu}")

    def optimizer_text(self, ref: Ref, site: cst.CSTNode) -> str:
        return f"{self.owner_at(site)}.{ref.name}" if ref.kind == "attr" else ref.name

    def scale_backward(self, backward: Backward, scaler: str) -> None:
        if backward.apex is not None:
            kept = backward.apex.body.body[0].body[0].value.args  # `scaled.backward(retain_graph=...)`: see check_apex_with
            call = cst.parse_expression(f"{scaler}.scale({code_of(without_parens(backward.loss))}).backward()").with_changes(args=kept)
            self.edits.swap[backward.statement] = lambda old, call=call: cst.SimpleStatementLine(body=[cst.Expr(call)], leading_lines=old.leading_lines)
            return

        def scale(updated: cst.Call) -> cst.Call:
            scaled = cst.Call(func=cst.parse_expression(f"{scaler}.scale"), args=[cst.Arg(without_parens(updated.func.value))])
            return updated.with_changes(func=updated.func.with_changes(value=scaled))

        self.edits.replace[backward.call] = scale

