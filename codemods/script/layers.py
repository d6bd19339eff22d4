"""Which layers a model builds, as far as the file shows: the words that
split a batch (ddp, accelerate, fabric, accumulate) note the layers that
compute on each part alone (BatchNorm's statistics, dropout's masks).

A model is built from torch's layers directly (`nn.Sequential(nn.Linear(...),
nn.BatchNorm1d(...))`) or by calling a class of the file, whose own body (and
the classes of the file it calls in turn) builds them.
"""

from __future__ import annotations

import libcst as cst

from .._syntax import walk

BATCH_NORM = frozenset(
    f"{module}.{name}"
    for module in ("torch.nn", "torch.nn.modules.batchnorm")
    for name in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d", "SyncBatchNorm")
)
CONVERT = frozenset({"torch.nn.SyncBatchNorm.convert_sync_batchnorm", "torch.nn.modules.batchnorm.SyncBatchNorm.convert_sync_batchnorm"})
# Layers and calls that draw random numbers while training (dropout masks, noise).
RANDOM_LAYERS = frozenset(
    {f"torch.nn.{name}" for name in ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout")}
    | {f"torch.nn.functional.{name}" for name in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "gumbel_softmax")}
    | {f"torch.{name}" for name in ("randn_like", "rand_like", "randint_like", "bernoulli", "normal", "multinomial")}
)


def builds_layer_of(script, code: cst.CSTNode, layers: frozenset) -> bool:
    """`code` (a model's constructor call, a class) names one of `layers`, or
    calls a class of the file that does."""
    classes = {s.name.value: s for s in script.module.body if isinstance(s, cst.ClassDef)}
    return _builds(script, code, layers, classes, set())


def _builds(script, code: cst.CSTNode, layers: frozenset, classes: dict, seen: set) -> bool:
    for node in walk(code):
        if isinstance(node, (cst.Name, cst.Attribute)) and script.qualified_names(node) & layers:
            return True
        if isinstance(node, cst.Call):
            for name in set(script.qualified_names(node.func)) & classes.keys() - seen:
                seen.add(name)
                if _builds(script, classes[name], layers, classes, seen):
                    return True
    return False
