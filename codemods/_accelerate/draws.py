"""Random draws in a loop that trains. Every process is seeded alike, so a
draw there gives each process the same numbers, where the original drew
different ones for each sample of the global batch.

A draw sized by this step's batch (a GAN's noise, `torch.randn(b, nz)` with
`b = real.size(0)`: read as the ddp codemod reads it, codemods/_ddp/noise.py)
becomes the draw for the global batch, the same numbers on every process as
the original's, of which each process keeps the rows of its own samples:
Accelerate's `split_batches=True` (dispatched or not) gives process i the
rows [i*b, (i+1)*b) of every global batch; Fabric's DistributedSampler gives
rank r the rows r::world (`own_rows`, the planner's). In a world of one this
is the original's draw. Other draws stay refused (AM831).

Noted (AM816), as random numbers that on N processes are not the
original's: dropout in a trained model (each process draws its own masks for
its slice of the batch), and noise where Accelerate's main process alone
draws a shuffled loader's order (`dispatch_batches=True`) from the global
RNG, which the other processes' noise then runs behind.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from .._base import code_of, walk
from .._ddp.noise import DRAWS, BatchReading
from ..script.layers import BATCH_NORM, CONVERT, RANDOM_LAYERS, builds_layer_of
from .common import ACCELERATOR, CannotMigrate, expression

# numpy's and Python's random draws: seeded alike on every process, as torch's.
HOST_DRAWS = frozenset(
    {f"numpy.random.{f}" for f in ("random", "rand", "randn", "normal", "uniform", "randint", "choice", "permutation", "binomial", "beta", "standard_normal")}
    | {f"random.{f}" for f in ("random", "uniform", "gauss", "normalvariate", "choices", "sample")}
)

# For a per-process size `b` (its code): the size of the global draw, and what
# follows the draw to keep this process's rows of it.
Rows = Callable[[str], "tuple[str, str]"]


def contiguous_rows(size: str) -> tuple[str, str]:
    """Accelerate with `split_batches=True`: process i holds rows [i*b, (i+1)*b) of the global batch."""
    return f"{size} * {ACCELERATOR}.num_processes", f".split({size})[{ACCELERATOR}.process_index]"


class Draws(BatchReading):
    def __init__(self, planner, own_rows: Rows) -> None:
        self.planner = planner
        self.codemod = planner.codemod
        self.own_rows = own_rows

    def plan(self, random_draws: frozenset) -> None:
        for call in self.planner._calls(random_draws):
            loop = self.codemod.innermost_loop(call)
            if loop is None or not self.planner.uses.trains(loop.body):
                continue
            batches = self._loop_over_batches(call)
            dims = self._draw_dims(call) if batches is not None and self.codemod.is_call_to(call, DRAWS) else None
            if dims and self._is_batch_size(dims[0], *self._batch_names(batches)):
                self._share(call, dims[0])
                continue
            raise CannotMigrate(
                call, "AM831",
                f"`{code_of(call.func)}(...)` in a loop that trains: every process draws the same numbers for its "
                f"slice of the batch; accelerate changed nothing; see `--to ddp` (draw_rank_share) or give each "
                f"process its own rows of the original's draw by hand",
            )

    def note_draws_in_helpers(self, random_draws: frozenset) -> None:
        """A note where a loop that trains calls a function of the file that
        draws random numbers (a gradient penalty's interpolation weights):
        every process draws the numbers seeded alike, for its own slice."""
        drawing = random_draws | HOST_DRAWS
        for call in self.planner.uses.calls:
            loop = self.codemod.innermost_loop(call)
            if loop is None or not self.planner.uses.trains(loop.body):
                continue
            draw = self.codemod.script.flow.call_in_callees(call, lambda c: self.codemod.is_call_to(c, drawing))
            if draw is not None:
                self.planner.plan.notes.append((
                    call, "AM816",
                    f"`{code_of(call.func)}(...)` draws random numbers (`{code_of(draw.func)}(...)`) for the training "
                    f"step: on N processes each draws them for its own slice of the batch, not the original's rows, so a "
                    f"seeded run trains as well as the original, not to the same numbers",
                ))
                return

    def refuse_host_draws_of_the_batch(self) -> None:
        """numpy's and Python's generators are seeded alike on every process too: a draw sized by the batch
        (`np.random.normal(0, 1, (x.shape[0], nz))`) gives each process the same numbers for its slice."""
        for call in self.planner._calls(HOST_DRAWS):
            loop = self.codemod.innermost_loop(call)
            batches = self._loop_over_batches(call) if loop is not None and self.planner.uses.trains(loop.body) else None
            if batches is None:
                continue
            tensors, sizes = self._batch_names(batches)
            if any(isinstance(n, cst.BaseExpression) and self._is_batch_size(n, tensors, sizes) for n in walk(call)):
                raise CannotMigrate(
                    call, "AM831",
                    f"`{code_of(call.func)}(...)` sized by the batch in a loop that trains: every process draws the same "
                    f"numbers for its slice of the batch; accelerate changed nothing; draw it with torch "
                    f"(`torch.randn(b, ...)` with `b = x.size(0)`, which accelerate shares out among the processes), "
                    f"then run accelerate again",
                )

    def _loop_over_batches(self, call: cst.Call) -> cst.For | None:
        """The loop around `call` over a training loader (`for i, data in enumerate(dataloader)`)."""
        loaders = {loader.name for loader in self.planner.training_loaders}
        for ancestor in self.codemod.ancestors(call):
            if isinstance(ancestor, cst.For) and any(isinstance(n, cst.Name) and n.value in loaders for n in walk(ancestor.iter)):
                return ancestor
        return None

    def _share(self, call: cst.Call, first: cst.BaseExpression) -> None:
        size = code_of(first)
        drawn, rows = self.own_rows(size)

        def edit(updated: cst.Call) -> cst.BaseExpression:
            dims = self._draw_dims(updated)
            whole = updated.deep_replace(dims[0], expression(drawn))
            return expression(f"{code_of(whole)}{rows}")

        self.planner.plan.edit(call, edit)
        message = (
            f"`{code_of(call.func)}({drawn}, ...){rows}`: the draw for the global batch, alike on every process as "
            f"the original's, and this process's rows of it (those of its own samples); exact where every global "
            f"batch splits evenly"
        )
        self.planner.plan.fixes.append((call, "AM815", message))
        if self.planner.shuffled_loaders and self.planner.dispatches_shuffled_loaders and self.planner.parity:
            behind = (
                "on N processes the main process alone draws the shuffled loader's order, from the random numbers "
                "the other processes draw this noise from: theirs runs behind its, so a seeded run trains as well as "
                "the original, not to the same numbers"
            )
            self.planner.plan.notes.append((call, "AM816", behind))

    def note_per_process_layers(self, steps) -> None:
        """Notes at the first trained model built here whose layers compute on
        each process's slice alone: dropout or noise draws its own numbers
        there (AM816), BatchNorm its own statistics (AM817)."""
        module = self.planner.module
        models = [m for m in {id(m.origin): m.origin for step in steps for m in step.models}.values() if m.value is not None]
        converted = any(self.codemod.is_call_to(c, CONVERT) for c in walk(module) if isinstance(c, cst.Call))
        notes = [
            (RANDOM_LAYERS, "AM816", "this model draws random numbers while it trains (dropout, noise): each process draws its own "
             "for its slice of the batch, so a seeded run trains as well as the original, not to the same numbers"),
            (BATCH_NORM, "AM817", f"this model's BatchNorm layers compute their statistics on each process's slice of the batch: "
             f"on GPUs, `torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)` before `{ACCELERATOR}.prepare` gives "
             f"statistics over the whole batch"),
        ]
        for layers, code, message in notes:
            if code == "AM817" and converted:
                continue
            model = next((m for m in models if builds_layer_of(self.codemod.script, m.value, layers)), None)
            if model is not None:
                self.planner.plan.notes.append((model.value, code, message))
