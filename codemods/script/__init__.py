"""The script model: one analysis of a training script, shared by every codemod.

source -> `precheck(source)` (CPython's ast: which codemods can apply at all,
`words_that_may_apply`) -> LibCST parse -> `ScriptModel.of(wrapper)` (imports,
scopes, models, optimizers, loaders, training steps and their loops,
evaluation regions, devices, functions and call sites, entry point) ->
codemods, which ask the model and rewrite.

Importing this package imports neither torch nor LibCST's metadata providers
beyond positions: `accelmigrate check` stays fast.
"""

from .devices import DeviceBinding
from .entities import Entity
from .flow import CallSite, EntryPoint, Function
from .model import ScriptModel
from .precheck import SourceFacts, precheck
from .rules import RULES, words_that_may_apply
from .scopes import Binding, Scope
from .steps import EvaluationRegion, Loop, OptimizerStep, TrainingStep

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
