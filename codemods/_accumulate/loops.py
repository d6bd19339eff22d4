"""One training loop as the accumulate codemod reads it: its loader, the
enumerate index it already has, its backward call and the calls that must
run once per optimizer step. Which names are optimizers, schedulers and
gradient scalers comes from the script model."""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import libcst as cst

from .._base import CLIP_GRAD_FUNCTIONS, code_of, walk
from ..script import ScriptModel
from ..script.accumulate_facts import has_no_length
from .syntax import Problem, is_method_call, positional_args, receiver, target_key

ENUMERATE = frozenset({"builtins.enumerate"})
PROGRESS_BARS = frozenset({"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm", "tqdm.rich.tqdm"})
AUTOGRAD_BACKWARD = frozenset({"torch.autograd.backward"})
# Gradient clipping through an Accelerator or a Fabric (torch's own functions: CLIP_GRAD_FUNCTIONS).
TRAINER_CLIPS = frozenset({"clip_grad_norm_", "clip_grad_value_", "clip_gradients"})
LOOPS = (cst.For, cst.While)
DEFINITIONS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


@dataclasses.dataclass
class UpdateCall:
    """A call that must run once per optimizer step."""

    call: cst.Call
    role: str  # zero_grad, optimizer_step, scaler_step, scaler_update, unscale, clip, scheduler_step, unknown_step
    optimizer: Optional[str] = None  # the optimizer it steps, for the step roles


@dataclasses.dataclass
class LoopShape:
    """A training loop as the codemods understand it."""

    loop: cst.For
    loader: cst.BaseExpression  # what `len()` counts
    index: Optional[str]  # the enumerate index the loop already has
    backward: cst.Call
    backward_index: int  # position in the loop body of the statement holding it
    optimizers: list[str]
    updates: list[UpdateCall]


class LoopReader:
    """Reads a loop that holds backward() or an optimizer step: its loader
    and the calls that must run once per step."""

    def __init__(self, script: ScriptModel) -> None:
        self.script = script

    def read(self, loop: Union[cst.For, cst.While]) -> Union[LoopShape, Problem]:
        if not isinstance(loop, cst.For) or loop.asynchronous is not None:
            return Problem(loop, "AM601", "the training loop is not a `for` loop over a data loader: its last batch cannot be known; accumulate by hand")
        source = self.loader_of(loop)
        if isinstance(source, Problem):
            return source
        loader, index = source
        if not isinstance(loop.body, cst.IndentedBlock):
            return Problem(loop, "AM602", "the loop body shares the `for` line: put it on its own lines first")
        exits = self._early_exits(loop)
        if exits is not None:
            return exits
        backwards = self.backward_calls(loop)
        if len(backwards) > 1:
            return Problem(loop, "AM603", f"{len(backwards)} backward passes in one loop (a GAN or multi-loss loop?): accumulate each model's gradients by hand")
        if backwards and self.script.is_qualified(backwards[0].func, AUTOGRAD_BACKWARD):
            return Problem(backwards[0], "AM602", "torch.autograd.backward(): divide the losses by the group's size and gate the optimizer step by hand")
        updates = self.update_calls(loop, backwards[0] if backwards else None)
        if isinstance(updates, Problem):
            return updates
        optimizers = sorted({u.optimizer for u in updates if u.optimizer is not None})
        if not backwards:
            return Problem(loop, "AM604", "the optimizer steps in this loop but backward() runs elsewhere (in a helper?): accumulate by hand")
        if not optimizers:
            return Problem(loop, "AM604", "backward() runs in this loop but no optimizer steps in it (in a helper?): accumulate by hand")
        if len(optimizers) > 1:
            return Problem(loop, "AM603", f"several optimizers step in this loop ({', '.join(optimizers)}): accumulate by hand")
        position = self._top_level_index(loop, backwards[0])
        if position is None:
            return Problem(backwards[0], "AM602", "backward() runs conditionally (inside an if, try or nested block): accumulate by hand")
        return LoopShape(loop, loader, index, backwards[0], position, optimizers, updates)

    def loader_of(self, loop: cst.For) -> Union[tuple[cst.BaseExpression, Optional[str]], Problem]:
        """(the loader whose len() counts the batches, the existing enumerate index)."""
        iterable, index = loop.iter, None
        if self.script.is_call_to(iterable, ENUMERATE):
            start = _enumerate_start(iterable)
            if start != 0:
                return Problem(loop, "AM602", "enumerate() starts at a number other than 0: make it start at 0, then migrate")
            first = positional_args(iterable)
            elements = loop.target.elements if isinstance(loop.target, (cst.Tuple, cst.List)) else ()
            if len(first) < 1 or len(elements) != 2 or not isinstance(elements[0].value, cst.Name):
                return Problem(loop, "AM602", "the loop's enumerate() index is not a plain name: accumulate by hand")
            iterable, index = first[0].value, elements[0].value.value
        if self.script.is_call_to(iterable, PROGRESS_BARS) and positional_args(iterable):
            iterable = positional_args(iterable)[0].value
        if target_key(iterable) is None:
            return Problem(loop, "AM601", f"the loop iterates over `{code_of(iterable)}`, not a named data loader: its last batch cannot be known; accumulate by hand")
        if has_no_length(self.script, iterable):
            return Problem(loop, "AM601", f"`{code_of(iterable)}` has no length (IterableDataset or generator): the epoch's last batch cannot be known; accumulate by hand")
        return iterable, index

    def backward_calls(self, loop: Union[cst.For, cst.While]) -> list[cst.Call]:
        """The `.backward(...)` calls the loop runs itself."""
        return [c for c in self._own_calls(loop) if is_method_call(c, "backward")]

    def _early_exits(self, loop: cst.For) -> Optional[Problem]:
        """A break, continue or return would end a group before its step."""
        for node in walk(loop.body, into_definitions=False):
            if isinstance(node, (cst.Break, cst.Continue)) and self._repeated_by(node, loop):
                keyword = "break" if isinstance(node, cst.Break) else "continue"
                return Problem(node, "AM602", f"`{keyword}` in the training loop can end a group of micro-batches before its optimizer step: accumulate by hand")
        for node in walk(loop.body, into_definitions=False):
            if isinstance(node, cst.Return):
                return Problem(node, "AM602", "`return` in the training loop can end a group of micro-batches before its optimizer step: accumulate by hand")
        return None

    def _repeated_by(self, node: cst.CSTNode, loop: cst.For) -> bool:
        """`node` belongs to `loop` itself, not to a loop nested in its body."""
        for ancestor in self.script.ancestors(node):
            if ancestor is loop.body:
                return True
            if isinstance(ancestor, LOOPS):
                return False
        return False

    def _own_calls(self, loop: cst.For) -> list[cst.Call]:
        """Calls that the loop runs itself, once per iteration or less (not in a
        nested loop, function or class)."""
        return [n for n in walk(loop.body, into_definitions=False) if isinstance(n, cst.Call) and self._repeated_by(n, loop)]

    def update_calls(self, loop: cst.For, backward: Optional[cst.Call]) -> Union[list[UpdateCall], Problem]:
        calls = self._own_calls(loop)
        zeroed = {target_key(receiver(c)) for c in calls if is_method_call(c, "zero_grad")}
        scaled = _scalers_of(backward)
        updates = []
        for call in calls:
            role = self._role(call, zeroed, scaled)
            if role is None:
                continue
            if role.role == "unknown_step":
                return Problem(call, "AM602", f"cannot tell whether `{code_of(receiver(call))}` is an optimizer or a learning-rate scheduler: accumulate by hand")
            if role.role == "optimizer_step" and call.args:
                return Problem(call, "AM602", "the optimizer step takes a closure (LBFGS-style): accumulate by hand")
            updates.append(role)
        return updates

    def _kind(self, expression: cst.BaseExpression) -> Optional[str]:
        """What the model says a name or `self.x` holds where it is used."""
        return self.script.kind_of(expression) if target_key(expression) is not None else None

    def _role(self, call: cst.Call, zeroed: set[Optional[str]], scalers: set[str]) -> Optional[UpdateCall]:
        if self.script.is_call_to(call, CLIP_GRAD_FUNCTIONS):
            return UpdateCall(call, "clip")
        if not isinstance(call.func, cst.Attribute):
            return None
        method, owner = call.func.attr.value, target_key(receiver(call))
        if method in TRAINER_CLIPS and owner is not None and call.args:
            return UpdateCall(call, "clip")  # `accelerator.clip_grad_norm_(...)`, `fabric.clip_gradients(...)`
        kind = self._kind(receiver(call))
        is_scaler = kind == "scaler" or owner in scalers
        if method == "zero_grad":
            return UpdateCall(call, "zero_grad")
        if is_scaler and method == "step" and len(positional_args(call)) >= 1:
            return UpdateCall(call, "scaler_step", code_of(positional_args(call)[0].value))
        if is_scaler and method == "update":
            return UpdateCall(call, "scaler_update")
        if is_scaler and method == "unscale_":
            return UpdateCall(call, "unscale")
        if method != "step" or owner is None:
            return None
        if kind == "optimizer":
            return UpdateCall(call, "optimizer_step", owner)
        if kind == "scheduler":
            return UpdateCall(call, "scheduler_step")
        if owner in zeroed and kind is None:
            return UpdateCall(call, "optimizer_step", owner)  # it steps and zeroes gradients: an optimizer
        return UpdateCall(call, "unknown_step")

    def _top_level_index(self, loop: cst.For, node: cst.CSTNode) -> Optional[int]:
        """The index, in the loop body, of the statement holding `node`, when
        only `with` blocks (autocast, apex's scale_loss) stand between them."""
        body = loop.body.body  # type: ignore[union-attr]
        child = node
        for ancestor in self.script.ancestors(node):
            if ancestor is loop.body:
                return body.index(child) if child in body else None
            if isinstance(ancestor, (cst.If, cst.Else, cst.Try, cst.ExceptHandler, cst.Finally, cst.For, cst.While)):
                return None
            child = ancestor
        return None


def _scalers_of(backward: Optional[cst.Call]) -> set[str]:
    """`scaler` when the backward reads `scaler.scale(loss).backward()`."""
    if backward is None:
        return set()
    scaled = receiver(backward)
    if is_method_call(scaled, "scale") and target_key(receiver(scaled)) is not None:
        return {target_key(receiver(scaled))}
    return set()


def _enumerate_start(call: cst.Call) -> Optional[int]:
    positional = positional_args(call)
    start = positional[1].value if len(positional) > 1 else None
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "start":
            start = arg.value
    if start is None:
        return 0
    if isinstance(start, cst.Integer):
        return int(start.value, 0)
    return None


__all__ = ["LoopReader", "LoopShape", "UpdateCall"]
