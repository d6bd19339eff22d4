"""What each process computes on its own share of the batch under DDP, as
notes: BatchNorm statistics (sync-bn shares them), and random draws made in
the step (dropout masks, noise in a forward, numpy draws), which no longer
fall on the rows the original drew them for: a seeded run trains as well,
but not to the same bits."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from .._base import walk
from ..script import vocabulary as v
from .queries import ScriptQueries

BATCH_NORM = frozenset(
    f"{module}.{name}"
    for module in ("torch.nn", "torch.nn.modules.batchnorm")
    for name in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d", "SyncBatchNorm")
)
CONVERT = frozenset({"torch.nn.SyncBatchNorm.convert_sync_batchnorm", "torch.nn.modules.batchnorm.SyncBatchNorm.convert_sync_batchnorm"})
FOLLOW_DEPTH = 4  # names followed back to where the model is built
# Layers and calls that draw random numbers while training (dropout masks, noise).
RANDOM_LAYERS = frozenset(
    {f"torch.nn.{name}" for name in ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout")}
    | {f"torch.nn.functional.{name}" for name in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "gumbel_softmax")}
    | {f"torch.{name}" for name in ("randn_like", "rand_like", "randint_like", "bernoulli", "normal", "multinomial")}
)
RANDOM_IN_STEP = frozenset({"torch.rand", "torch.randn", "torch.randint", "torch.randperm", "torch.bernoulli", "torch.normal", "torch.randn_like", "torch.rand_like"})


class BatchNormNote(ScriptQueries):
    def _note_batch_norm(self, models: list) -> None:
        """A note at each model that ddp wraps now, built here with BatchNorm
        layers, unless the file converts them to SyncBatchNorm already."""
        if not models or self._calls_to(v.DISTRIBUTED_DATA_PARALLEL) or self._calls_to(CONVERT):
            return
        classes = {s.name.value: s for s in self._module.body if isinstance(s, cst.ClassDef)}
        for model in models:
            built = next((value for value in self._built_as(model) if self._builds_layer_of(value, BATCH_NORM, classes, set())), None)
            if built is not None:
                self.report(
                    built, "AM538",
                    "this model's BatchNorm layers will compute their statistics on each process's share of the "
                    "batch: add `--to sync-bn` (SyncBatchNorm, GPUs) for statistics over the whole batch",
                )

    def _note_rank_randomness(self, models: list) -> None:
        """A note where a wrapped model built here draws random numbers in its
        layers, or the training step draws them itself (a torch draw that
        `draw_rank_share` does not rewrite, any numpy or `random` draw)."""
        if not models or self._calls_to(v.DISTRIBUTED_DATA_PARALLEL):
            return
        classes = {s.name.value: s for s in self._module.body if isinstance(s, cst.ClassDef)}
        for model in models:
            built = next((value for value in self._built_as(model) if self._builds_layer_of(value, RANDOM_LAYERS, classes, set())), None)
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

    def _builds_layer_of(self, code: cst.CSTNode, layers: frozenset, classes: dict, seen: set) -> bool:
        """`code` names one of `layers`, or calls a class of this file that does."""
        for node in walk(code):
            if isinstance(node, (cst.Name, cst.Attribute)) and self.qualified_names(node) & layers:
                return True
            if isinstance(node, cst.Call):
                for name in set(self.qualified_names(node.func)) & classes.keys() - seen:
                    seen.add(name)
                    if self._builds_layer_of(classes[name], layers, classes, seen):
                        return True
        return False
