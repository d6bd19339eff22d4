"""BatchNorm layers a model visibly builds: under DDP each process computes
their statistics on its own share of the batch (sync-bn shares them)."""

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


class BatchNormNote(ScriptQueries):
    def _note_batch_norm(self, models: list) -> None:
        """A note at each model that ddp wraps now, built here with BatchNorm
        layers, unless the file converts them to SyncBatchNorm already."""
        if not models or self._calls_to(v.DISTRIBUTED_DATA_PARALLEL) or self._calls_to(CONVERT):
            return
        classes = {s.name.value: s for s in self._module.body if isinstance(s, cst.ClassDef)}
        for model in models:
            built = next((value for value in self._built_as(model) if self._builds_batch_norm(value, classes, set())), None)
            if built is not None:
                self.report(
                    built, "AM538",
                    "this model's BatchNorm layers will compute their statistics on each process's share of the "
                    "batch: add `--to sync-bn` (SyncBatchNorm, GPUs) for statistics over the whole batch",
                )

    def _built_as(self, model) -> Iterator[cst.BaseExpression]:
        for binding in self._bindings_of_var(model):
            value = binding.value
            for _ in range(FOLLOW_DEPTH):
                if value is None:
                    break
                yield value
                entity = self.script.entity(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
                value = entity.origin.value if entity is not None and entity.origin.value is not value else None

    def _builds_batch_norm(self, code: cst.CSTNode, classes: dict, seen: set) -> bool:
        """`code` names a BatchNorm class, or calls a class of this file that does."""
        for node in walk(code):
            if isinstance(node, (cst.Name, cst.Attribute)) and self.qualified_names(node) & BATCH_NORM:
                return True
            if isinstance(node, cst.Call):
                for name in set(self.qualified_names(node.func)) & classes.keys() - seen:
                    seen.add(name)
                    if self._builds_batch_norm(classes[name], classes, seen):
                        return True
        return False
