"""What each process computes on its own share of the batch under DDP, as
notes: a last batch shared out unevenly, BatchNorm statistics (sync-bn
shares them), and random draws made in the step (dropout masks, noise in a forward, numpy draws), which no longer
fall on the rows the original drew them for: a seeded run trains as well,
but not to the same bits."""

from __future__ import annotations

from typing import Iterator

import libcst as cst
from libcst.metadata import PositionProvider

from .._base import walk
from ..script import vocabulary as v
from ..script.layers import BATCH_NORM, CONVERT, RANDOM_LAYERS, builds_layer_of
from .queries import ScriptQueries

FOLLOW_DEPTH = 4  # names followed back to where the model is built
RANDOM_IN_STEP = frozenset({"torch.rand", "torch.randn", "torch.randint", "torch.randperm", "torch.bernoulli", "torch.normal", "torch.randn_like", "torch.rand_like"})


class BatchNormNote(ScriptQueries):
    def _note_batch_norm(self, models: list) -> None:
        """A note at each model that ddp wraps now, built here with BatchNorm
        layers, unless the file converts them to SyncBatchNorm already."""
        if not models or self._calls_to(v.DISTRIBUTED_DATA_PARALLEL) or self._calls_to(CONVERT):
            return
        for model in models:
            built = next((value for value in self._built_as(model) if builds_layer_of(self.script, value, BATCH_NORM)), None)
            if built is not None:
                self.report(
                    built, "AM538",
                    "this model's BatchNorm layers will compute their statistics on each process's share of the "
                    "batch: add `--to sync-bn` (SyncBatchNorm, GPUs) for statistics over the whole batch",
                )

    def _note_uneven_shares(self) -> None:
        """A note at each training DataLoader ddp shards without `drop_last=True`."""
        for call in self._unevenly_shared:
            self.report(
                call, "AM536",
                "on N processes a data set the number of processes does not divide is padded with its first samples "
                "(DistributedSampler), and a last batch smaller than the batch size is shared out unevenly, each rank "
                "averaging its own share: `drop_last=True`, or a data set the batch size divides, keeps the original's steps",
            )

    def _note_rank_randomness(self, models: list) -> None:
        """A note where a wrapped model built here draws random numbers in its
        layers, or the training step draws them itself (a torch draw that
        `draw_rank_share` does not rewrite, any numpy or `random` draw)."""
        if not models or self._calls_to(v.DISTRIBUTED_DATA_PARALLEL):
            return
        for model in models:
            built = next((value for value in self._built_as(model) if builds_layer_of(self.script, value, RANDOM_LAYERS)), None)
            if built is not None:
                self.report(
                    built, "AM535",
                    "this model draws random numbers while it trains (dropout, noise): each process draws its own for "
                    "its share of the batch, so a seeded run trains as well as the original but not to the same numbers",
                )
                return
        for loop in self._training_loops():
            draw = next((n for n in walk(loop) if isinstance(n, cst.Call) and self._random_draw_in_step(n)), None)
            if draw is not None:
                self.report(
                    draw, "AM535",
                    "a random draw in the training step: each process draws its own, for its share of the batch, so "
                    "a seeded run trains as well as the original but not to the same numbers",
                )
                return
            if not self._iterates_a_loader(loop):
                continue  # batches drawn without a DataLoader: alike on every rank, or shared by rows
            for call in (n for n in walk(loop) if isinstance(n, cst.Call)):
                draw = self.script.flow.call_in_callees(call, self._random_draw_in_step)
                if draw is not None:
                    self.report(
                        call, "AM535",
                        f"`{self._code(call.func)}(...)` draws random numbers (`{self._code(draw.func)}(...)`, line "
                        f"{self.get_metadata(PositionProvider, draw).start.line}) for the training step: each process draws its own, for its share "
                        f"of the batch, so a seeded run trains as well as the original but not to the same numbers",
                    )
                    return

    def _iterates_a_loader(self, loop: cst.CSTNode) -> bool:
        """`for x, y in loader:` (through `enumerate(...)`, `tqdm(...)`): each
        rank's share of the batch comes from its sampler."""
        iterable = loop.iter if isinstance(loop, cst.For) else None
        while isinstance(iterable, cst.Call) and iterable.args:
            iterable = iterable.args[0].value
        return iterable is not None and self.script.kind_of(iterable) == "loader"

    def _training_loops(self) -> list[cst.CSTNode]:
        """The innermost loop around each backward call, once each."""
        loops: list[cst.CSTNode] = []
        for backward in self._uses.backward_calls:
            loop = next((a for a in self.ancestors(backward) if isinstance(a, (cst.For, cst.While))), None)
            if loop is not None and loop not in loops:
                loops.append(loop)
        return loops

    def _random_draw_in_step(self, call: cst.Call) -> bool:
        if call in self._rank_shared_draws:  # each rank takes the original's rows of it
            return False
        if any(isinstance(a, cst.With) and any(isinstance(i.item, cst.Call) and self.is_qualified(i.item.func, v.NO_GRAD) for i in a.items) for a in self.ancestors(call)):
            return False  # samples or evaluation: nothing trains on it
        names = self.qualified_names(call.func)
        if names & RANDOM_IN_STEP:
            return True
        return any(name.startswith(("numpy.random.", "random.")) for name in names)

    def _built_as(self, model) -> Iterator[cst.BaseExpression]:
        for binding in self._bindings_of_var(model):
            value = binding.value
            for _ in range(FOLLOW_DEPTH):
                if value is None:
                    break
                yield value
                entity = self.script.entity(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
                value = entity.origin.value if entity is not None and entity.origin.value is not value else None
