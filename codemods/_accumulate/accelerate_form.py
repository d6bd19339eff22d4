"""What a `X.backward(loss)` loop trains through (`trainer_of`: an
Accelerator, a Lightning Fabric, or something unknown), and accumulation in
Accelerate's own form, for a loop that trains through
`accelerator.backward(loss)`: the plan the accumulate codemod reads from the
loop (what goes under `with accelerator.accumulate(model):`, what is gated
by `accelerator.sync_gradients`, which zero_grad() moves after the step)
and the rewrite of the loop, the Accelerator's call and a summed loss.

Why this form. A prepared optimizer skips `step()` and `zero_grad()` while
`accelerator.sync_gradients` is False, a prepared scheduler skips its step,
and `accelerator.accumulate(model)` sets that flag (every
`gradient_accumulation_steps`-th micro-batch and the last batch of a
prepared loader) and skips the gradient all-reduce in between. What the
prepared objects do not skip by themselves is written by hand: clipping
(`if accelerator.sync_gradients:`), and a `zero_grad()` written before the
forward, which would run at the group's last micro-batch, before its
backward, and clear the group's gradients: it moves after the step.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

import libcst as cst

from .._base import code_of, walk
from ..script import ScriptModel
from .loops import AUTOGRAD_BACKWARD, LoopShape
from .syntax import (
    Problem,
    is_method_call,
    mentions,
    positional_args,
    receiver,
    target_key,
    wrap_block,
)

ACCELERATOR_CLASSES = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
FABRIC_CLASSES = frozenset(
    {"lightning_fabric.Fabric", "lightning_fabric.fabric.Fabric", "lightning.fabric.Fabric", "lightning.Fabric", "lightning.fabric.fabric.Fabric"}
)
SETUP_METHODS = ("setup", "setup_module")  # what makes a Fabric module (no_backward_sync takes no other)
STEPS_KEYWORD = "gradient_accumulation_steps"
UNSETTABLE = ("gradient_accumulation_plugin",)  # Accelerate refuses it together with gradient_accumulation_steps


@dataclasses.dataclass
class Trainer:
    """What a `X.backward(loss)` call trains through."""

    kind: str  # "accelerate", "fabric" or "unknown"
    name: str  # how the loop spells it: "accelerator", "self.accelerator"
    made_by: Optional[cst.Call] = None  # the one Accelerator(...) call it holds


@dataclasses.dataclass
class AcceleratePlan:
    """How one loop is rewritten in Accelerate's form."""

    accelerator: str
    models: list[str]
    first: int  # body positions of the first and last statements under accumulate()
    last: int
    moved: set[int]  # zero_grad() statements before the forward, moved after the step
    gated: set[int]  # statements under `if accelerator.sync_gradients:` (clipping, an unprepared scheduler)


def trainer_of(script: ScriptModel, backward: cst.Call) -> Optional[Trainer]:
    """The trainer of `X.backward(loss, ...)` (a positional argument: not a
    tensor's own backward); None for `loss.backward()`."""
    if not positional_args(backward) or not isinstance(backward.func, cst.Attribute) or script.is_qualified(backward.func, AUTOGRAD_BACKWARD):
        return None
    holder = receiver(backward)
    name = target_key(holder)
    if name is None:
        return Trainer("unknown", code_of(holder))
    calls = script.values_of(holder)
    if len(calls) == 1 and script.is_call_to(calls[0], ACCELERATOR_CLASSES):
        return Trainer("accelerate", name, calls[0])
    if calls and all(script.is_call_to(c, FABRIC_CLASSES) for c in calls):
        return Trainer("fabric", name)  # nothing to set on it: where it is made does not matter
    if any(script.is_call_to(c, ACCELERATOR_CLASSES) for c in calls):
        return Trainer("accelerate", name)  # made in several places: the setting cannot be written once
    return Trainer("unknown", name)


def accumulates_already(loop: cst.For) -> bool:
    """The loop runs under `with X.accumulate(...)` (Accelerate's form, a previous run)."""
    return any(
        isinstance(node, cst.WithItem) and is_method_call(node.item, "accumulate") for node in walk(loop.body, into_definitions=False)
    )


def steps_setting(call: cst.Call, steps: int, constant: str) -> Union[bool, Problem]:
    """True when `Accelerator(...)` needs `gradient_accumulation_steps=` added,
    False when it sets N already, a Problem when it sets something else."""
    if any(arg.star for arg in call.args):
        return Problem(call, "AM608", f"the Accelerator is built with `*`/`**` arguments, which may set its gradient accumulation: add `{STEPS_KEYWORD}={constant}` to it by hand and wrap the step in `with accelerator.accumulate(model):`")
    for arg in call.args:
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword in UNSETTABLE:
            return Problem(arg, "AM608", f"the Accelerator takes a `{keyword}`: set its num_steps to {steps} by hand and wrap the step in `with accelerator.accumulate(model):`")
        if keyword == STEPS_KEYWORD:
            value = arg.value
            if (isinstance(value, cst.Integer) and int(value.value, 0) == steps) or (isinstance(value, cst.Name) and value.value == constant):
                return False
            return Problem(arg, "AM608", f"the Accelerator already sets `{STEPS_KEYWORD}={code_of(value)}`: make it {steps} (or migrate with accumulate={code_of(value)}) by hand")
    return True


def with_steps_setting(call: cst.Call, constant: str) -> cst.Call:
    """`Accelerator(..., gradient_accumulation_steps=ACCUMULATION_STEPS)`."""
    setting = cst.Arg(
        keyword=cst.Name(STEPS_KEYWORD),
        value=cst.Name(constant),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    args = list(call.args)
    if args and args[-1].comma is cst.MaybeSentinel.DEFAULT:
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, setting])


def is_prepared_by(script: ScriptModel, expression: cst.BaseExpression, accelerator: str, methods: Sequence[str] = ("prepare",), depth: int = 2) -> bool:
    """Some binding in reach of `expression` is a target of `accelerator.prepare(...)`
    (or of another of the trainer's `methods`: Fabric's `setup`); for a
    parameter, what every call of its function in the file passes is. The
    accelerator keeps its spelling through the call: `train(accelerator, model)`."""
    for binding in script.bindings_of_reference(expression):
        statement = binding.statement
        value = getattr(statement, "value", None)
        if isinstance(value, cst.Call) and any(is_method_call(value, m) for m in methods) and target_key(receiver(value)) == accelerator:
            return True
        if binding.kind == "param" and depth > 0:
            function = script.flow.function_of(binding.scope)
            passed = [site.arguments.get(binding.name) for site in (function.callers if function is not None else [])]
            if passed and all(
                isinstance(p, (cst.Name, cst.Attribute)) and is_prepared_by(script, p, accelerator, methods, depth - 1) for p in passed
            ):
                return True
    return False


def summed_operand(argument: cst.BaseExpression, accelerator: str) -> cst.BaseExpression:
    """The loss of `loss * accelerator.num_processes` (`loss * fabric.world_size`:
    the accelerate and fabric codemods' summed loss), whose reduction is the
    loss's; the argument otherwise."""
    if (
        isinstance(argument, cst.BinaryOperation)
        and isinstance(argument.operator, cst.Multiply)
        and code_of(argument.right) in (f"{accelerator}.num_processes", f"{accelerator}.world_size")
    ):
        return argument.left
    return argument


def plan_loop(script: ScriptModel, shape: LoopShape, trainer: Trainer, at_start: set[int], at_end: set[int], models: Sequence[str]) -> Union[AcceleratePlan, Problem]:
    """What goes under accumulate() and what is gated, or why the loop is left alone."""
    name = trainer.name
    body = list(shape.loop.body.body)  # type: ignore[union-attr]
    by_hand = f"wrap the forward, backward and optimizer step in `with {name}.accumulate(model):` by hand"
    if not is_prepared_by(script, shape.loader, name):
        return Problem(shape.loop, "AM610", f"`{code_of(shape.loader)}` is not passed to `{name}.prepare(...)`, so Accelerate cannot end a group at the epoch's last batch: prepare it, then migrate (or {by_hand})")
    if not models:
        return Problem(shape.backward, "AM610", f"the model trained in this loop cannot be found: {by_hand}")
    gated = set()
    for update in shape.updates:
        position = _position_of(body, update.call)
        if update.role in ("scaler_step", "scaler_update", "unscale"):
            return Problem(update.call, "AM610", f"a gradient scaler with `{name}.backward()`: let Accelerate scale (`Accelerator(mixed_precision=...)`) and remove the scaler, then migrate")
        if update.role == "optimizer_step" and not is_prepared_by(script, receiver(update.call), name):
            return Problem(update.call, "AM610", f"`{update.optimizer}` is not passed to `{name}.prepare(...)`, so it would step on every micro-batch: prepare it, then migrate")
        unskipped = update.role == "clip" or (update.role == "scheduler_step" and not is_prepared_by(script, receiver(update.call), name))
        if unskipped and not _gated_already(body[position], name):
            gated.add(position)  # nothing of Accelerate's skips it off the group's last micro-batch
    model_uses = [p for p in range(shape.backward_index + 1) if p not in at_start and any(mentions(body[p], m) for m in models)]
    first = min([*at_start, *model_uses, shape.backward_index])
    last = max([*at_end, shape.backward_index])
    return AcceleratePlan(name, list(models), first, last, set(at_start), gated)


def called_prepared(script: ScriptModel, shape: LoopShape, accelerator: str, methods: Sequence[str] = ("prepare",)) -> list[str]:
    """The models of a step the script model cannot name: what the step
    calls (`self.model(x)`) among the targets of `accelerator.prepare(...)`."""
    body = shape.loop.body.body  # type: ignore[union-attr]
    found: dict[str, None] = {}
    for statement in body[: shape.backward_index + 1]:
        for node in walk(statement, into_definitions=False):
            if isinstance(node, cst.Call) and target_key(node.func) is not None and is_prepared_by(script, node.func, accelerator, methods):
                found[target_key(node.func)] = None
    return list(found)


def rewrite_body(plan: AcceleratePlan, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """The loop body with the step under accumulate(), clipping gated and an
    early zero_grad() moved after the step."""
    inside: list[cst.BaseStatement] = []
    position = plan.first
    while position <= plan.last:
        if position in plan.moved:
            position += 1
            continue
        if position in plan.gated:
            end = position
            while end + 1 in plan.gated:
                end += 1
            inside.append(wrap_block(f"if {plan.accelerator}.sync_gradients", body[position : end + 1]))
            position = end + 1
            continue
        inside.append(body[position])
        position += 1
    inside.extend(body[p] for p in sorted(plan.moved))
    models = ", ".join(plan.models)
    block = wrap_block(f"with {plan.accelerator}.accumulate({models})", inside)
    return [*body[: plan.first], block, *body[plan.last + 1 :]]


def _gated_already(statement: cst.BaseStatement, accelerator: str) -> bool:
    """`if accelerator.sync_gradients:` (Accelerate's documented clipping)."""
    return isinstance(statement, cst.If) and code_of(statement.test) == f"{accelerator}.sync_gradients"


def _position_of(body: Sequence[cst.BaseStatement], node: cst.CSTNode) -> int:
    for position, statement in enumerate(body):
        if any(n is node for n in walk(statement)):
            return position
    return -1


__all__ = [
    "SETUP_METHODS",
    "AcceleratePlan",
    "Trainer",
    "accumulates_already",
    "called_prepared",
    "is_prepared_by",
    "plan_loop",
    "rewrite_body",
    "steps_setting",
    "summed_operand",
    "trainer_of",
    "with_steps_setting",
]
