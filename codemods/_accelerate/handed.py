"""A training loop in another module of the project, handed what this file
builds: `train.py` makes the model, its optimizer and the training
DataLoader and calls `engine.train_fn(train_loader, model, optimizer,
device)`, whose loop calls `backward()` (the project fact `training_loops`,
accelmigrate/project/training_loops.py).

A careful engineer moving that project onto Accelerate prepares the three
where they are made, passes the Accelerator to the loop, and routes the
loop's backward, clipping, output and checkpoints through it in `engine.py`.
Here the call stands for the training step it runs (`HandedStep`, read as
the planner reads a `TrainingStep` written in this file): what it is handed
is prepared, and the call gets `accelerator=accelerator`. The module's side
is received.py; the engine writes the two files together, and neither when
either is refused (accelmigrate/engine/migrate.py).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst

from .._base import code_of
from ..script import project_facts
from ..script.reduction import sums_or_unclear
from ..script.scopes import Scope
from .common import CannotMigrate


@dataclasses.dataclass(eq=False)
class HandedLoop:
    """The training DataLoader a handed loop iterates, and the loop of this file around the call (an epoch loop)."""

    node: Optional[cst.For]
    loader: object  # the loader's Entity


@dataclasses.dataclass(eq=False)
class ReturnedLoader:
    """A training DataLoader that a function of another module of the project
    builds and returns (`train_loader, test_loader = data_setup.create_dataloaders(...)`):
    prepared here all the same; its DataLoader call is not seen here (`value`)."""

    name: str
    at: cst.CSTNode  # the name it is bound to
    call: cst.Call  # the call that returns it
    value = None

    @classmethod
    def of(cls, name: cst.Name, call: cst.Call) -> "ReturnedLoader":
        return cls(name.value, name, call)


@dataclasses.dataclass(eq=False)
class HandedOptimizer:
    """An optimizer the call hands to the loop, which steps it there."""

    call: cst.Call
    optimizer: str
    entity: object


@dataclasses.dataclass(eq=False)
class HandedStep:
    """A call of another module's training loop, standing for the training
    step it runs, with the fields of a `TrainingStep` that planning reads."""

    backward: cst.Call  # the call: where the step runs, seen from this file
    function: Scope
    models: list
    optimizer_steps: list
    loops: list
    loop_name: str  # as this file names it: "engine.train_fn"
    mixed_precision: str  # the loop's autocast ("fp16", "bf16", "?"; "" for none), which the Accelerator made here runs
    called_in_loops: list = dataclasses.field(default_factory=list)
    steps_in_caller: bool = False
    is_complete: bool = True


def handed_steps(planner) -> list[HandedStep]:
    """The calls of a training loop of another module that this file hands
    its model, optimizer and training DataLoader; none without the fact."""
    facts = {fact.name: fact for fact in project_facts.current().training_loops}
    script = planner.script
    steps = []
    for call in planner.uses.calls if facts else ():
        names = sorted(script.qualified_names(call.func) & facts.keys())
        if not names:
            continue
        if any(a.star for a in call.args):
            raise CannotMigrate(call, "AM820", f"`{code_of(call.func)}(...)` hands its training loop `*` arguments that cannot be seen: accelerate changed nothing")
        fact = facts[names[0]]
        passed = [(a.keyword.value if a.keyword else None, a.value) for a in call.args]
        model, loader = _entity(script, fact.argument(passed, "model"), "model"), _loader(script, fact.argument(passed, "loader"))
        optimizers = [
            HandedOptimizer(call, code_of(a.value), found) for a in call.args for found in [_entity(script, a.value, "optimizer")] if found is not None
        ]
        if model is None or loader is None or not optimizers:
            missing = "the model" if model is None else "the training DataLoader" if loader is None else "an optimizer"
            raise CannotMigrate(
                call, "AM820",
                f"`{code_of(call.func)}(...)` runs the training loop of another module, and {missing} it is handed cannot be "
                f"traced to where this file makes it: accelerate changed nothing; pass names this file binds to what it "
                f"makes, then run accelerate again",
            )
        _refuse_summed_criterion(script, call)
        around = next((loop.node for loop in script.loops_around(call) if isinstance(loop.node, cst.For)), None)
        steps.append(HandedStep(call, script.scope_of(call), [model], optimizers, [HandedLoop(around, loader)], names[0], fact.mixed_precision))
    return steps


def _refuse_summed_criterion(script, call: cst.Call) -> None:
    """A criterion built here that sums over the batch (`nn.MSELoss(reduction="sum")`), or whose reduction cannot be
    read: the loop there cannot see it, and DDP's average would make its gradient a fraction of the original's."""
    for argument in call.args:
        if sums_or_unclear(script, argument.value):
            raise CannotMigrate(
                argument, "AM823",
                f"`{code_of(argument.value)}` sums over the batch (or its reduction cannot be read), and the loop it is "
                f"handed to cannot tell: accelerate changed nothing; DDP averages the processes' gradients, which is the "
                f"original's gradient for a mean over the batch only: use a mean, or migrate by hand",
            )


def _loader(script, argument: Optional[cst.BaseExpression]):
    """The loader entity a plain name holds, or the loader another module's function returns to it."""
    found = _entity(script, argument, "loader")
    built = script.loader_built_elsewhere(argument) if found is None and argument is not None else None
    return ReturnedLoader.of(argument, built) if built is not None else found


def _entity(script, argument: Optional[cst.BaseExpression], kind: str):
    """The entity of `kind` that a plain name passed to the loop holds, else None."""
    if not isinstance(argument, cst.Name):
        return None
    found = script.entity(argument)
    return found if found is not None and found.kind == kind else None


__all__ = ["HandedLoop", "HandedOptimizer", "HandedStep", "ReturnedLoader", "handed_steps"]
