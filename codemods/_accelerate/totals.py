"""Running totals of a training loop combined across the processes right
after it (AM833 under accelerate, AM933 under fabric).

Each process's loop adds up only its slice of every batch (`running_loss +=
loss.item() * x.size(0)`, `correct += (pred == y).sum().item()`), so what the
code after the loop prints or returns would be one process's part: an epoch's
loss divided by the data set's length, a world-size fraction of the
original's. Sums and counts are added up across the processes, per-batch
means averaged (each process adds one mean per batch, over its slice); which
is which is read by codemods/script/running_totals.py. A total that is a
Python number goes through a float64 (or int64) tensor and comes back a
number of its own type, exactly; one that may be a tensor is reduced as it is.
"""

from __future__ import annotations

from typing import Callable

import libcst as cst

from ..script.running_totals import MEAN_PER_BATCH, RunningTotal, running_totals
from .common import ACCELERATOR, statement

REDUCTIONS = {MEAN_PER_BATCH: "mean"}


def reduction_of(total: RunningTotal) -> str:
    return REDUCTIONS.get(total.kind, "sum")


def accelerator_combined(total: RunningTotal) -> str:
    """`total = accelerator.reduce(...)`: the processes' totals combined."""
    reduction = reduction_of(total)
    if total.python_type is None:
        return f'{total.name} = {ACCELERATOR}.reduce({total.name}, reduction="{reduction}")'
    dtype = "torch.int64" if total.python_type == "int" and reduction == "sum" else "torch.float64"
    tensor = f"torch.tensor({total.name}, dtype={dtype}, device={ACCELERATOR}.device)"
    return f'{total.name} = {ACCELERATOR}.reduce({tensor}, reduction="{reduction}").item()'


def plan_running_totals(planner, steps, combined: Callable[[RunningTotal], str]) -> None:
    """After each loop over a prepared training loader, its totals combined."""
    loops: dict[cst.For, None] = {}
    for step in steps:
        for loop in step.loops or step.called_in_loops:
            loader = planner.loader_of(loop)
            if loader is not None and loader in planner.training_loaders and isinstance(loop.node, cst.For):
                loops[loop.node] = None
    combine_after(planner, list(loops), combined)


def combine_after(planner, loops: list, combined: Callable[[RunningTotal], str]) -> None:
    """After each of `loops` (over a prepared training loader), its totals combined."""
    has_torch = any(b.name == "torch" and b.qualified == "torch" for b in planner.script.imports)
    for loop in loops:
        totals = [t for t in running_totals(planner.script, loop) if has_torch or t.python_type is None]
        if not totals:
            continue
        written = [combined(total) for total in totals]
        planner.plan.after.setdefault(loop, []).extend(statement(code, planner.config) for code in written)
        listed = "; ".join(f"`{code}`" for code in written)
        planner.plan.fixes.append((
            loop.target, "AM833",
            f"{listed} after the loop: each process adds up only its slice of every batch, so the code after the "
            "loop reads the one-process total",
        ))
