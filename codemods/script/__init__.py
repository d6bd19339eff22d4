"""The script model: one analysis of a training script, shared by every codemod.

source -> `precheck(source)` (CPython's ast: which codemods can apply at all,
`words_that_may_apply`) -> LibCST parse -> `ScriptModel.of(wrapper)` (imports,
scopes, models, optimizers, loaders, training steps and their loops,
evaluation regions, devices, functions and call sites, entry point) ->
codemods, which ask the model and rewrite.

Importing this package imports neither torch nor LibCST: the pre-check
(`precheck`, `rules`) is plain `ast`, and the model's modules, which need
LibCST, are imported when one of their names is first asked for, so that
`accelmigrate check` of a file the pre-check rejects never loads LibCST.
"""

import importlib

from .precheck import SourceFacts, precheck
from .rules import RULES, words_that_may_apply

_LAZY = {
    "DeviceBinding": "devices",
    "Entity": "entities",
    "CallSite": "flow",
    "EntryPoint": "flow",
    "Function": "flow",
    "ScriptModel": "model",
    "Binding": "scopes",
    "Scope": "scopes",
    "EvaluationRegion": "steps",
    "Loop": "steps",
    "OptimizerStep": "steps",
    "TrainingStep": "steps",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value

__all__ = [
    "Binding",
    "CallSite",
    "DeviceBinding",
    "Entity",
    "EntryPoint",
    "EvaluationRegion",
    "Function",
    "Loop",
    "OptimizerStep",
    "RULES",
    "Scope",
    "ScriptModel",
    "SourceFacts",
    "TrainingStep",
    "precheck",
    "words_that_may_apply",
]
