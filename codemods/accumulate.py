"""accumulate=N: gradient accumulation over N micro-batches per optimizer step.

What it does
    Rewrites a training loop so that each optimizer step uses the gradient of
    N consecutive batches of the loader (micro-batches):

    - a loss that averages over the batch (a criterion's default
      `reduction="mean"`, `F.cross_entropy(...)`, `.mean()`) is divided by the
      number of micro-batches in its group before `backward()`; the `loss`
      variable itself is untouched, so what the loop logs keeps meaning the
      per-batch loss. A loss that sums over the batch (`reduction="sum"`,
      `size_average=False`, `.sum()`, a sum scaled by a constant such as the
      data set's size) is not divided: the micro-batches' sums add up to the
      big batch's sum, so the gradient is already the big batch's (dividing
      it would train at 1/N of the learning rate). Which one the loss is
      comes from `codemods/script/reduction.py`, followed through the
      criterion's binding, functional losses, the file's own loss functions
      and classes, and arithmetic;
    - `optimizer.step()`, gradient clipping, `scaler.unscale_()`,
      `scaler.step()`, `scaler.update()`, a learning-rate scheduler stepped
      inside the loop and a `zero_grad()` written after `backward()` run at
      the last micro-batch of each group; a `zero_grad()` written before
      `backward()` runs at the first. The last batch of the epoch always ends
      a group, so no gradient is dropped or carried into the next epoch;
    - under `DistributedDataParallel` (the `ddp` codemod's output, or the
      user's own), the forward and backward of a micro-batch that does not
      end its group run inside `model.no_sync()`, so gradients are
      all-reduced once per group instead of once per micro-batch.

    The loop counts micro-batches with `enumerate` (reusing an index the loop
    already has) and finds the epoch's last one with `len(loader)`.
    `ACCUMULATION_STEPS = N` is defined once, after the imports.

Why
    The effective batch grows N-fold while the activations held at once stay
    those of one micro-batch: a batch that does not fit in device memory can
    still be trained on, with the same arithmetic. Under DDP, skipping the
    all-reduce of the non-final micro-batches saves N - 1 gradient exchanges
    per step.

    The epoch's last group. A mean-reduced loss over a big batch is the mean
    of its samples; accumulation averages the means of the group's
    micro-batches. Dividing by the number of micro-batches actually in the
    group (`group_size`, which is N except for the last, shorter group of an
    epoch) keeps that an average. The two agree exactly when every
    micro-batch of the group holds the same number of samples: always, except
    when the data set size is not a multiple of the micro-batch size and the
    epoch's last group holds more than one micro-batch; then the short last
    micro-batch weighs as much as a full one (as it does in a run without
    accumulation at that batch size).

Example
    Before::

        for epoch in range(epochs):
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                print(loss.item())

    After (`--to accumulate=4`)::

        ACCUMULATION_STEPS = 4  # micro-batches per optimizer step (gradient accumulation)
        ...
        for epoch in range(epochs):
            for batch_idx, (x, y) in enumerate(loader):
                # This micro-batch's accumulation group (the epoch's last may be shorter).
                group_start = batch_idx - batch_idx % ACCUMULATION_STEPS
                group_size = min(ACCUMULATION_STEPS, len(loader) - group_start)
                end_of_group = batch_idx + 1 == group_start + group_size
                if batch_idx == group_start:
                    optimizer.zero_grad()
                loss = criterion(model(x), y)
                (loss / group_size).backward()
                if end_of_group:
                    optimizer.step()
                print(loss.item())

    With DDP, the statements from the forward to `backward()` are wrapped in
    `with no_sync_unless(end_of_group, model):` (from
    `accelmigrate.runtime.batch`): `model.no_sync()` unless the micro-batch
    ends its group, and nothing for a model that is not wrapped (a plain
    `python train.py` run of a script that wraps only under a launcher).
    After `amp`, the backward is `scaler.scale(loss / group_size).backward()`
    and `scaler.unscale_()`, clipping, `scaler.step()` and `scaler.update()`
    move under `if end_of_group:` together.

Through Accelerate or Lightning Fabric
    A loop that trains through `accelerator.backward(loss)` (`accelerator`
    made by `accelerate.Accelerator(...)`: the accelerate codemod's output, or
    the user's own) gets Accelerate's own form instead:
    `gradient_accumulation_steps=ACCUMULATION_STEPS` on the Accelerator, and
    the step, from the forward to `zero_grad()`, under
    `with accelerator.accumulate(model):` (each model the step trains). The
    prepared optimizer and scheduler skip their steps and `zero_grad()` off
    the group's last micro-batch by themselves, so they are not gated;
    clipping is, under `if accelerator.sync_gradients:`. A `zero_grad()`
    written before the forward moves after the step (left there, it would run
    at the group's last micro-batch, before its backward, and clear the
    group's gradients). `accelerator.backward` divides every loss by the
    accumulation steps: a mean loss is left as it is, a summed one is
    multiplied back by `accelerator.gradient_accumulation_steps` (so a step
    is the big batch's sum). Accelerate ends a group every N micro-batches
    and at the end of a prepared loader, so a mean loss is exact when the
    loader's length is a multiple of N; otherwise the epoch's last, shorter
    group of k micro-batches steps with k/N of their mean gradient (AM609).

    A loop that trains through `fabric.backward(loss)` (a Lightning
    `Fabric`) gets the plain form, with the loss divided inside the call
    (`fabric.backward(loss / group_size)`) and, around the forward and
    backward, `with fabric.no_backward_sync(model, enabled=not end_of_group):`
    (Fabric's no_sync; a no-op on one device).

    After `--to accelerate,accumulate=4` the loop above reads::

        for x, y in loader:
            with accelerator.accumulate(model):
                loss = criterion(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()

Left alone
    Only loops whose shape is proven are rewritten; the others get a finding
    that says what to do by hand:

    - AM601: the loop's length cannot be known: a `while` loop, an
      `IterableDataset` (defined in the file), `zip(...)`, a generator, or a
      loader built in the `for` statement. A loader the file cannot see is
      assumed to have a length: `len(loader)` fails loudly at the first
      batch if it has none.
    - AM602: a shape that accumulation would change: the optimizer step is
      already conditional (the loop may accumulate already), `break`,
      `continue` or `return` in the loop (a group would end early), no
      `zero_grad()` in the loop, a `.step()` on an object that cannot be told
      apart as an optimizer or a scheduler, the enumerate index reassigned or
      started at a number other than 0, a value computed by a gated statement
      and read on every micro-batch.
    - AM603: several backward passes or several optimizers in one loop (GANs,
      multi-task with separate optimizers).
    - AM604: `backward()` or the optimizer step in a function with no loop
      (a helper called from the training loop), or a loop with `backward()`
      but no optimizer step.
    - AM605 (after a rewrite): a learning-rate scheduler stepped per batch
      now steps once per group: divide the step counts it was built with.
    - AM606: the no_sync part under DDP (fixed, or what to do by hand).
    - AM608: the Accelerator already sets another
      `gradient_accumulation_steps`, takes a `gradient_accumulation_plugin`
      or `**kwargs`, or is made by several calls.
    - AM609 (a note): a mean loss under `accelerator.backward` and an
      epoch whose length may not be a multiple of N (see above).
    - AM610: the loop's loader or optimizer is not passed to
      `accelerator.prepare(...)`, a GradScaler is used with
      `accelerator.backward`, or the model the step trains cannot be named.
    - AM611: `X.backward(loss)` on something that is neither an Accelerator
      nor a Fabric (a DeepSpeed engine, which accumulates itself): never
      taken for `loss.backward()`.
    - AM607: something in the file decides whether the loss is a mean or a
      sum but cannot be read (`reduction=args.reduction`, a sum divided by a
      value the file does not show, which may be the batch size, a mean
      added to a sum): dividing or not would be a guess either way.
      A loss about which the file says nothing (`loss = model(x, y)`,
      `outputs.loss`) is divided as a mean, as torch's losses, Hugging Face
      models and timm compute it by default; if yours sums over the batch,
      remove the `/ group_size`.
    An epoch-level scheduler (stepped outside the batch loop) and evaluation
    loops (no `backward()`) are not touched. `# accelmigrate: skip` on the
    `for` line leaves its loop alone.

    - AM614 (a note): the model the loop trains is built here with
      BatchNorm layers, which normalise each micro-batch with its own
      statistics: the accumulated step is close to, not equal to, the big
      batch's (GroupNorm or LayerNorm computes the same either way).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence, Union

import libcst as cst
from libcst.metadata import PositionProvider

from ._accumulate.factor import constant_statement, fresh_name, insert_module_statement, is_integer, module_constant, parse_factor
from ._options import STEPS_MEANING
from ._accumulate.loops import LoopReader, LoopShape, UpdateCall
from ._accumulate.accelerate_form import SETUP_METHODS, AcceleratePlan, Trainer, accumulates_already, called_prepared, is_prepared_by, plan_loop, rewrite_body, steps_setting, summed_operand, trainer_of, with_steps_setting
from ._accumulate.syntax import Problem, is_method_call, mentions, positional_args, wrap_block
from ._base import Codemod, code_of, times_or_divided, walk
from .script.accumulate_facts import Uses, anchors, ddp_models
from .script.layers import BATCH_NORM, builds_layer_of
from .script.reduction import SUM, UNCLEAR, backward_reduction, loss_reduction

STEPS_CONSTANT = "ACCUMULATION_STEPS"
RUNTIME_BATCH = "accelmigrate.runtime.batch"
UNCLEAR_MESSAGE = (
    "cannot tell whether this loss is a mean or a sum over the batch (a `sum(...)` of terms a loop makes, a `reduction=` that is not a literal, a sum "
    "scaled by a value this file does not show, a mean added to a sum): accumulate by hand, dividing a mean by the "
    "number of micro-batches in the group before backward() and leaving a sum undivided"
)

UNCLEAR_UNDER_ACCELERATE = (
    "cannot tell whether this loss is a mean or a sum over the batch (a `sum(...)` of terms a loop makes, a `reduction=` that is not a literal, a sum "
    "scaled by a value this file does not show, a mean added to a sum): accumulate by hand under "
    "`with {accelerator}.accumulate(model):`, leaving a mean as it is ({accelerator}.backward divides it by the "
    "accumulation steps) and multiplying a sum by `{accelerator}.gradient_accumulation_steps`"
)


@dataclasses.dataclass
class LoopPlan:
    """How one loop is rewritten: the names it gets and the statements gated."""

    index: str
    enumerate_added: bool
    loader: cst.BaseExpression
    group_start: str
    group_size: str
    end_of_group: str
    at_group_start: set[int]  # body positions of zero_grad() statements before backward()
    at_group_end: set[int]  # body positions of the statements gated to the group's end
    no_sync: Optional[tuple[int, int, str]] = None  # (first, last) body positions, model
    no_sync_header: str = ""  # Fabric's `with fabric.no_backward_sync(...)`; else no_sync_unless


class Accumulate(Codemod):
    word = "accumulate"
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    summary = "accumulate gradients over N micro-batches per optimizer step (--to accumulate=N)"
    codes = {
        "AM600": "training loop that steps the optimizer after every batch (accumulation over N micro-batches)",
        "AM601": "the training loop's length cannot be known: accumulate by hand",
        "AM602": "the training loop's shape cannot be proven: accumulate by hand",
        "AM603": "several backward passes or optimizers in one loop: accumulate by hand",
        "AM604": "backward() or the optimizer step outside the training loop: accumulate by hand",
        "AM605": "a per-batch learning-rate scheduler now steps once per group: rescale its step counts",
        "AM606": "DDP: micro-batches that do not end a group skip the gradient all-reduce (model.no_sync())",
        "AM607": "the loss's reduction over the batch (mean or sum) cannot be read: accumulate by hand",
        "AM608": "the Accelerator's gradient accumulation is set otherwise (or cannot be read): set it by hand",
        "AM609": "accelerator.backward divides the mean loss by N: exact when the loader's length is a multiple of N",
        "AM614": "BatchNorm statistics computed on each micro-batch",
        "AM610": "the Accelerate step cannot be put under accelerator.accumulate(): prepare what the message names, or accumulate by hand",
        "AM611": "backward(loss) through an object that is neither an Accelerator nor a Fabric: accumulate by hand",
    }
    notes = frozenset({"AM609", "AM614"})
    triggers = ("backward", "step")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps = parse_factor(self.options, self.word, STEPS_MEANING)
        self._plans: dict[cst.For, LoopPlan] = {}
        self._backwards: dict[cst.Call, str] = {}  # backward call -> group size name
        self._accelerate_plans: dict[cst.For, AcceleratePlan] = {}
        self._accelerator_calls: set[cst.Call] = set()  # Accelerator(...) calls that get gradient_accumulation_steps
        self._summed_backwards: dict[cst.Call, str] = {}  # accelerator.backward(sum) -> the accelerator's name
        self._define_constant = False
        self._name_taken = False  # STEPS_CONSTANT is used, but not as a module constant
        self._identifiers: set[str] = set()  # every name the file uses: new names avoid them

    # -- suppression: a loop is silenced by a comment on its `for` line(s) only --

    def is_suppressed(self, node: cst.CSTNode, code: str) -> bool:
        if not isinstance(node, cst.For):
            return super().is_suppressed(node, code)
        header_end = self.get_metadata(PositionProvider, node.iter).end.line
        start = self.get_metadata(PositionProvider, node).start.line
        for line in range(start, header_end + 1):
            codes = self.suppressions.get(line, frozenset())
            if codes is None or code in codes:
                return True
        return False

    # -- analysis ---------------------------------------------------------------------

    def visit_Module(self, node: cst.Module) -> None:
        script = self.script
        constant = module_constant(node, STEPS_CONSTANT)
        if constant is not None and not is_integer(constant.value, self.steps):
            self.report(constant, "AM602", f"{STEPS_CONSTANT} is already {code_of(constant.value)}: set it to {self.steps} by hand")
            return
        in_loops, loose = anchors(script)
        for function, calls in loose.items():
            where = f"`{function.name.value}`" if isinstance(function, cst.FunctionDef) else "this module"
            self.report(calls[0], "AM604", f"backward() or the optimizer step runs in {where} outside any loop (a helper called from the training loop?): accumulate at that loop by hand")
        if not in_loops:
            return
        self._identifiers = Uses.of(script).identifiers
        self._name_taken = constant is None and STEPS_CONSTANT in self._identifiers
        reader = LoopReader(script)
        for loop in in_loops:
            self._plan(loop, reader)
        self._define_constant = bool(self._plans or self._accelerate_plans) and constant is None

    def _plan(self, loop: Union[cst.For, cst.While], reader: LoopReader) -> None:
        if self._name_taken:
            self.report(loop, "AM602", f"the name {STEPS_CONSTANT} is already used in this file (not as a module constant): rename it, then migrate")
            return
        if mentions(loop.body, STEPS_CONSTANT) or accumulates_already(loop):
            return  # accumulates already (a previous run)
        backwards = reader.backward_calls(loop)
        trainer = trainer_of(self.script, backwards[0]) if len(backwards) == 1 else None
        refused = self._trainer_problem(backwards[0], trainer) if trainer is not None else None
        if refused is not None:
            self.report(refused.node, refused.code, refused.message)
            return
        shape = reader.read(loop)
        if isinstance(shape, Problem):
            self.report(shape.node, shape.code, shape.message)
            return
        plan = self._plan_shape(shape)
        if isinstance(plan, Problem):
            self.report(plan.node, plan.code, plan.message)
            return
        if trainer is not None and trainer.kind == "accelerate":
            self._plan_accelerate(shape, plan, trainer)
            return
        if trainer is not None:  # Fabric: the plain form, with Fabric's own no-sync
            reduction = loss_reduction(self.script, summed_operand(positional_args(shape.backward)[0].value, trainer.name))
        else:
            reduction = backward_reduction(self.script, shape.backward)
        if reduction == UNCLEAR:
            self.report(shape.backward, "AM607", UNCLEAR_MESSAGE)
            return
        if not self.fix(loop, "AM600", self._fixed_message(shape, summed=reduction == SUM)):
            return
        self._plans[loop] = plan
        self._note_batch_norm(shape)
        if reduction != SUM:  # a sum over each micro-batch adds up to the big batch's sum as it is
            self._backwards[shape.backward] = plan.group_size
        if trainer is not None:
            self._add_fabric_no_sync(shape, plan, trainer.name)
        else:
            self._add_no_sync(shape, plan)
        for update in shape.updates:
            if update.role == "scheduler_step":
                self.report(update.call, "AM605", f"`{code_of(update.call)}` now runs once per {self.steps} micro-batches: divide the step counts the scheduler was built with (total_steps, steps_per_epoch, T_max, warm-up steps...) by {STEPS_CONSTANT}")

    def _add_fabric_no_sync(self, shape: LoopShape, plan: LoopPlan, fabric: str) -> None:
        """`with fabric.no_backward_sync(model, enabled=not end_of_group):` around
        the forward and backward (a no-op on one device): one all-reduce per group."""
        step = next((s for s in self.script.training_steps if s.backward is shape.backward), None)
        named = [(m, _use_in(shape.loop, m)) for m in (step.model_names if step is not None else [])]
        models = [m for m, use in named if use is not None and is_prepared_by(self.script, use, fabric, SETUP_METHODS)]
        models = models or called_prepared(self.script, shape, fabric, SETUP_METHODS)
        body = shape.loop.body.body  # type: ignore[union-attr]
        used = [p for p in range(shape.backward_index + 1) if p not in plan.at_group_start and any(mentions(body[p], m) for m in models)]
        if len(models) != 1 or not used:
            self.report(shape.backward, "AM606", f"the model `{fabric}.setup(...)` returned cannot be told in this loop: run the forward and backward of micro-batches that do not end a group under `with {fabric}.no_backward_sync(model, enabled=not {plan.end_of_group}):` by hand (it saves an all-reduce each)")
            return
        (model,) = models
        header = f"with {fabric}.no_backward_sync({model}, enabled=not {plan.end_of_group})"
        if self.fix(body[used[0]], "AM606", f"the forward and backward of micro-batches that do not end a group run under `{fabric}.no_backward_sync({model})`: one gradient all-reduce per group"):
            plan.no_sync = (used[0], shape.backward_index, model)
            plan.no_sync_header = header

    def _trainer_problem(self, backward: cst.Call, trainer: Trainer) -> Optional[Problem]:
        """Why a `X.backward(loss)` loop cannot be accumulated (never as `loss.backward()`)."""
        spelled = code_of(backward.func)
        if trainer.kind == "fabric":
            return None
        if trainer.kind == "unknown":
            return Problem(backward, "AM611", f"`{spelled}(...)` takes the loss as an argument, and `{trainer.name}` is neither an `accelerate.Accelerator` nor a Lightning `Fabric` that this file makes, so what it does with the loss is unknown: accumulate by hand (a DeepSpeed engine accumulates itself: set gradient_accumulation_steps in its config)")
        if trainer.made_by is None:
            return Problem(backward, "AM608", f"`{trainer.name}` is made by more than one Accelerator(...) call: set `gradient_accumulation_steps={STEPS_CONSTANT}` on the one that trains and wrap the step in `with {trainer.name}.accumulate(model):` by hand")
        setting = steps_setting(trainer.made_by, self.steps, STEPS_CONSTANT)
        return setting if isinstance(setting, Problem) else None

    def _plan_accelerate(self, shape: LoopShape, loop_plan: LoopPlan, trainer: Trainer) -> None:
        """Accelerate's own form: the step under `accelerator.accumulate(model)`,
        `gradient_accumulation_steps` on the Accelerator, clipping gated."""
        name = trainer.name
        step = next((s for s in self.script.training_steps if s.backward is shape.backward), None)
        models = (step.model_names if step is not None else []) or called_prepared(self.script, shape, name)
        plan = plan_loop(self.script, shape, trainer, loop_plan.at_group_start, loop_plan.at_group_end, models)
        if isinstance(plan, Problem):
            self.report(plan.node, plan.code, plan.message)
            return
        (argument,) = positional_args(shape.backward)[:1]
        reduction = loss_reduction(self.script, summed_operand(argument.value, name))
        if reduction == UNCLEAR:
            self.report(shape.backward, "AM607", UNCLEAR_UNDER_ACCELERATE.format(accelerator=name))
            return
        summed = reduction == SUM
        loss = (
            f"the loss sums over the batch: `{name}.backward` divides it by the accumulation steps, so it is multiplied back by `{name}.gradient_accumulation_steps`"
            if summed else f"`{name}.backward` divides the loss by the accumulation steps"
        )
        message = (
            f"accumulates gradients over {self.steps} micro-batches of `{code_of(shape.loader)}` under `{name}.accumulate({', '.join(plan.models)})` "
            f"(`gradient_accumulation_steps={STEPS_CONSTANT}` on the Accelerator): {loss}; the prepared optimizer steps once per group and at the epoch's last batch"
            + (", and clipping runs only then" if any(u.role == "clip" for u in shape.updates) else "")
        )
        if not self.fix(shape.loop, "AM600", message):
            return
        self._accelerate_plans[shape.loop] = plan
        self._note_batch_norm(shape)
        if steps_setting(trainer.made_by, self.steps, STEPS_CONSTANT) is True:
            self._accelerator_calls.add(trainer.made_by)
        if summed:
            self._summed_backwards[shape.backward] = name
        else:
            self.report(shape.backward, "AM609", f"`{name}.backward` divides each loss by {self.steps}, and Accelerate ends a group at the epoch's last batch: exact when `len({code_of(shape.loader)})` is a multiple of {STEPS_CONSTANT} (drop_last=True, or a data set the batches divide); otherwise the epoch's last, shorter group of k micro-batches steps with k/{self.steps} of their mean gradient")
        for update in shape.updates:
            if update.role == "scheduler_step":
                self.report(update.call, "AM605", f"`{code_of(update.call)}` now runs once per {self.steps} micro-batches: divide the step counts the scheduler was built with (total_steps, steps_per_epoch, T_max, warm-up steps...) by {STEPS_CONSTANT}")

    def _note_batch_norm(self, shape: LoopShape) -> None:
        """A note where the model the loop trains is built here with BatchNorm
        layers: they normalise each micro-batch with its own statistics."""
        step = next((s for s in self.script.training_steps if s.backward is shape.backward), None)
        models = [m.origin for m in step.models if m.origin.value is not None] if step is not None else []
        built = next((m.value for m in models if builds_layer_of(self.script, m.value, BATCH_NORM)), None)
        if built is not None:
            self.report(
                built, "AM614",
                f"this model's BatchNorm layers normalise each micro-batch with its own statistics: the accumulated "
                f"step is close to, not equal to, one on a {self.steps} times larger batch (GroupNorm or LayerNorm "
                f"computes the same either way)",
            )

    def _fixed_message(self, shape: LoopShape, summed: bool) -> str:
        loss = (
            "the loss sums over the batch, so the micro-batches' gradients add up to the big batch's as they are (not divided)"
            if summed else "the loss is divided by the group's size before backward()"
        )
        return (
            f"accumulates gradients over {self.steps} micro-batches of `{code_of(shape.loader)}`: {loss}, "
            f"and {shape.optimizers[0]} steps once per group and at the epoch's last batch"
        )

    def _plan_shape(self, shape: LoopShape) -> Union[LoopPlan, Problem]:
        body = list(shape.loop.body.body)  # type: ignore[union-attr]
        roles = {id(u.call): u for u in shape.updates}
        at_start, at_end = set(), set()
        for position, statement in enumerate(body):
            kind = self._statement_kind(statement, roles, shape)
            if isinstance(kind, Problem):
                return kind
            if kind == "zero_grad" and position < shape.backward_index:
                at_start.add(position)
            elif kind in ("zero_grad", "update") and position > shape.backward_index:
                at_end.add(position)
            elif kind == "update":
                return Problem(statement, "AM602", "an optimizer, scaler or scheduler step runs before backward() in the loop: accumulate by hand")
        if not any(update.role == "zero_grad" for update in shape.updates):
            return Problem(shape.loop, "AM602", "no zero_grad() in the training loop (gradients cleared elsewhere?): accumulate by hand")
        stale = self._read_while_stale(body, at_end)
        if stale is not None:
            return stale
        if shape.index is not None and self._reassigned(shape.loop, shape.index):
            return Problem(shape.loop, "AM602", f"the loop index `{shape.index}` is reassigned in the loop: accumulate by hand")
        taken = self._identifiers | {STEPS_CONSTANT}
        return LoopPlan(
            index=shape.index or fresh_name("batch_idx", taken),
            enumerate_added=shape.index is None,
            loader=shape.loader,
            group_start=fresh_name("group_start", taken),
            group_size=fresh_name("group_size", taken),
            end_of_group=fresh_name("end_of_group", taken),
            at_group_start=at_start,
            at_group_end=at_end,
        )

    def _statement_kind(self, statement: cst.CSTNode, roles: Mapping[int, UpdateCall], shape: LoopShape) -> Union[str, Problem, None]:
        """"zero_grad" or "update" when the statement does nothing but such calls,
        None when it holds none, a Problem when it mixes them with other code."""
        inside = [roles[id(c)] for c in walk(statement) if isinstance(c, cst.Call) and id(c) in roles]
        if not inside:
            return None
        if isinstance(statement, cst.SimpleStatementLine) and all(self._is_update_small(s, roles) for s in statement.body):
            return "zero_grad" if all(u.role == "zero_grad" for u in inside) else "update"
        stepping = [u for u in inside if u.role in ("optimizer_step", "scaler_step")]
        if isinstance(statement, cst.If) and not stepping and self._is_guarded_update(statement, roles, shape):
            return "zero_grad" if all(u.role == "zero_grad" for u in inside) else "update"
        if stepping and isinstance(statement, cst.If):
            return Problem(stepping[0].call, "AM602", "the optimizer step is already conditional (does the loop accumulate already?): left alone")
        first = inside[0].call
        return Problem(first, "AM602", f"`{code_of(first.func)}()` runs inside a compound statement or shares its line with other code: accumulate by hand")

    def _is_update_small(self, small: cst.BaseSmallStatement, roles: Mapping[int, UpdateCall]) -> bool:
        if isinstance(small, cst.Expr):
            return isinstance(small.value, cst.Call) and id(small.value) in roles
        if isinstance(small, (cst.Assign, cst.AnnAssign)):
            return isinstance(small.value, cst.Call) and id(small.value) in roles and roles[id(small.value)].role == "clip"
        return False

    def _is_guarded_update(self, statement: cst.If, roles: Mapping[int, UpdateCall], shape: LoopShape) -> bool:
        """`if args.clip: clip_grad_norm_(...)`: an if with no else whose body only
        updates, on a condition that does not count batches."""
        if statement.orelse is not None or not isinstance(statement.body, cst.IndentedBlock):
            return False
        if shape.index is not None and mentions(statement.test, shape.index):
            return False
        return all(
            isinstance(line, cst.SimpleStatementLine) and all(self._is_update_small(s, roles) for s in line.body)
            for line in statement.body.body
        )

    def _read_while_stale(self, body: Sequence[cst.CSTNode], gated: set[int]) -> Optional[Problem]:
        """A name set by a gated statement (`norm = clip_grad_norm_(...)`) and
        read by the others would be stale on most micro-batches."""
        assigned = {
            name.value
            for position in gated
            for target in walk(body[position])
            if isinstance(target, cst.AssignTarget)
            for name in walk(target)
            if isinstance(name, cst.Name)
        }
        for position, statement in enumerate(body):
            if position in gated:
                continue
            for name in sorted(assigned):
                if mentions(statement, name):
                    return Problem(statement, "AM602", f"`{name}` is set only when the optimizer steps but read on every micro-batch: accumulate by hand")
        return None

    def _reassigned(self, loop: cst.For, name: str) -> bool:
        binders = (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr, cst.AsName)
        for node in (n for n in walk(loop.body) if isinstance(n, binders)):
            bound = node.target if not isinstance(node, cst.AsName) else node.name
            if mentions(bound, name):
                return True
        return False

    def _add_no_sync(self, shape: LoopShape, plan: LoopPlan) -> None:
        """Under DDP, the forward and backward of a micro-batch that does not end
        its group skip the all-reduce: from the first statement that uses the
        model to the one holding backward()."""
        models = sorted(ddp_models(self.script))
        if not models:
            return
        body = shape.loop.body.body  # type: ignore[union-attr]
        used = [
            position
            for position in range(shape.backward_index + 1)
            if position not in plan.at_group_start and any(mentions(body[position], model) for model in models)
        ]
        in_loop = [model for model in models if any(mentions(body[p], model) for p in used)]
        if len(in_loop) != 1:
            model = " or ".join(f"`{m}`" for m in models)
            self.report(shape.backward, "AM606", f"the model is wrapped in DistributedDataParallel ({model}) but its forward in this loop cannot be found: run the forward and backward of micro-batches that do not end a group under `model.no_sync()` by hand (it saves an all-reduce each)")
            return
        (model,) = in_loop
        if self.fix(body[used[0]], "AM606", f"the forward and backward of micro-batches that do not end a group run under `{model}.no_sync()` (when it is wrapped in DistributedDataParallel): one gradient all-reduce per group"):
            plan.no_sync = (used[0], shape.backward_index, model)
            self.add_import(RUNTIME_BATCH, "no_sync_unless")

    # -- the rewrite -------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self._accelerator_calls:
            return with_steps_setting(updated_node, STEPS_CONSTANT)
        accelerator = self._summed_backwards.get(original_node)
        if accelerator is not None:
            loss, *rest = updated_node.args
            steps = cst.parse_expression(f"{accelerator}.gradient_accumulation_steps")
            times = times_or_divided(loss.value, cst.Multiply(), STEPS_CONSTANT).with_changes(right=steps)
            return updated_node.with_changes(args=[loss.with_changes(value=times), *rest])
        size = self._backwards.get(original_node)
        if size is None:
            return updated_node
        if positional_args(updated_node):  # `fabric.backward(loss)`: the loss is its argument
            loss, *rest = updated_node.args
            divided = times_or_divided(loss.value, cst.Divide(), size)
            return updated_node.with_changes(args=[loss.with_changes(value=divided), *rest])
        scaled = updated_node.func.value  # type: ignore[union-attr]
        if is_method_call(scaled, "scale") and len(scaled.args) == 1 and scaled.args[0].keyword is None:
            argument = scaled.args[0]
            new_receiver = scaled.with_changes(args=[argument.with_changes(value=times_or_divided(argument.value, cst.Divide(), size))])
        else:
            new_receiver = times_or_divided(scaled, cst.Divide(), size).with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return updated_node.with_changes(func=updated_node.func.with_changes(value=new_receiver))  # type: ignore[union-attr]

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        accelerate = self._accelerate_plans.get(original_node)
        if accelerate is not None:
            body = rewrite_body(accelerate, list(updated_node.body.body))  # type: ignore[union-attr]
            return updated_node.with_changes(body=updated_node.body.with_changes(body=body))
        plan = self._plans.get(original_node)
        if plan is None:
            return updated_node
        body = self._group_statements(plan, list(updated_node.body.body))  # type: ignore[union-attr]
        block = updated_node.body.with_changes(body=[*self._group_lines(plan), *body])
        loop = updated_node.with_changes(body=block)
        if plan.enumerate_added:
            loop = self._enumerated(loop, plan.index)
        return loop

    def _group_lines(self, plan: LoopPlan) -> list[cst.SimpleStatementLine]:
        n, index = STEPS_CONSTANT, plan.index
        lines = [
            f"{plan.group_start} = {index} - {index} % {n}",
            f"{plan.group_size} = min({n}, len({code_of(plan.loader)}) - {plan.group_start})",
            f"{plan.end_of_group} = {index} + 1 == {plan.group_start} + {plan.group_size}",
        ]
        statements = [cst.parse_statement(line + "\n") for line in lines]
        comment = cst.EmptyLine(indent=True, comment=cst.Comment("# This micro-batch's accumulation group (the epoch's last may be shorter)."))
        statements[0] = statements[0].with_changes(leading_lines=[comment])
        return statements

    def _group_statements(self, plan: LoopPlan, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """The body with the gated runs of statements under their `if`, and the
        forward-to-backward statements under no_sync when the model is DDP."""
        pieces: list[tuple[int, int, cst.BaseStatement]] = []  # (first, last) original positions
        position = 0
        while position < len(body):
            for gated, header in ((plan.at_group_start, f"if {plan.index} == {plan.group_start}"), (plan.at_group_end, f"if {plan.end_of_group}")):
                if position in gated:
                    end = position
                    while end + 1 in gated:
                        end += 1
                    pieces.append((position, end, wrap_block(header, body[position : end + 1])))
                    position = end + 1
                    break
            else:
                pieces.append((position, position, body[position]))
                position += 1
        if plan.no_sync is None:
            return [statement for _, _, statement in pieces]
        first, last, model = plan.no_sync
        inside = [statement for start, end, statement in pieces if first <= start and end <= last]
        before = [statement for start, _, statement in pieces if start < first]
        after = [statement for _, end, statement in pieces if end > last]
        header = plan.no_sync_header or f"with no_sync_unless({plan.end_of_group}, {model})"
        return [*before, wrap_block(header, inside), *after]

    def _enumerated(self, loop: cst.For, index: str) -> cst.For:
        target = loop.target
        if isinstance(target, cst.Tuple) and not target.lpar:
            target = target.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        new_target = cst.Tuple(
            elements=[cst.Element(cst.Name(index), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), cst.Element(target)],
            lpar=[],
            rpar=[],
        )
        new_iter = cst.Call(func=cst.Name("enumerate"), args=[cst.Arg(loop.iter)])
        return loop.with_changes(target=new_target, iter=new_iter)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self._define_constant:
            return updated_node
        constant = constant_statement(STEPS_CONSTANT, self.steps, "micro-batches per optimizer step (gradient accumulation)")
        return insert_module_statement(updated_node, constant)


def _use_in(loop: cst.For, name: str) -> Optional[cst.BaseExpression]:
    """A use of `name` (or `self.x`) in the loop, where its bindings are asked for."""
    return next((n for n in walk(loop.body) if isinstance(n, (cst.Name, cst.Attribute)) and code_of(n) == name), None)


__all__ = ["Accumulate"]
