"""Facts about training loops that the accumulate and batch-scale codemods
read, answered from the script model:

- `anchors`: the backward calls and known optimizer steps, grouped by the
  loop that repeats them (or, outside any loop, by their function);
- `ddp_models`: the names bound to a DistributedDataParallel wrap;
- `has_no_length`: a loop's iterable whose length cannot be asked for (a
  generator, `zip`/`map`/`iter`, a loader over an IterableDataset);
- `made_by_call`: the one call that made what a name or `self.x` holds where
  it is used, over every binding in reach (not only the latest);
- `Uses`: the identifiers of the file and how often names, attributes and
  string keys occur, for deciding whether a definition has a single reader.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Optional

import libcst as cst

from .._syntax import dotted_name
from . import vocabulary as v
from .model import ScriptModel

LENGTHLESS_CALLS = frozenset({"builtins.iter", "builtins.map", "builtins.zip", "builtins.filter"})
ATTRIBUTE_BY_STRING = ("getattr", "setattr", "hasattr", "delattr")


def method_of(call: cst.Call) -> Optional[str]:
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None


# -- where the training happens -----------------------------------------------------------


def backward_calls(script: ScriptModel) -> list[cst.Call]:
    """The training steps' `.backward(...)` calls (`loss.backward()`,
    `scaler.scale(loss).backward()`, `torch.autograd.backward(loss)`), not
    the frameworks' `manual_backward`."""
    return [step.backward for step in script.training_steps if method_of(step.backward) == "backward"]


def is_known_optimizer_step(script: ScriptModel, call: cst.Call) -> bool:
    """`x.step()` on what the model knows as an optimizer where it is used, or
    `scaler.step(optimizer)` on a gradient scaler."""
    if method_of(call) != "step" or not dotted_name(call.func.value):
        return False
    kind = script.kind_of(call.func.value)
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return kind == "optimizer" or (kind == "scaler" and len(positional) == 1)


def anchors(script: ScriptModel) -> tuple[dict, dict]:
    """(loop node -> its backward calls and known optimizer steps; function
    or module node -> those that run outside any loop), in source order. A
    loop's calls are those it repeats itself, not a nested loop's."""
    steps = [call for scope in script.scopes for call in scope.calls if is_known_optimizer_step(script, call)]
    order = script.index.order
    in_loops: dict = collections.defaultdict(list)
    loose: dict = collections.defaultdict(list)
    for call in sorted([*backward_calls(script), *steps], key=order.__getitem__):
        loops = script.loops_around(call)
        if loops:
            in_loops[loops[0].node].append(call)
        else:
            function = script.function_at(call)
            loose[function.node if function is not None else script.module].append(call)
    return in_loops, loose


def ddp_models(script: ScriptModel) -> frozenset:
    """The names (or `self.x`) assigned a DistributedDataParallel wrap, under a
    condition or not, or `X = DistributedDataParallel(...) if ... else X`
    (found once per model: every loop asks)."""
    return script.derived(_ddp_wrapped_names)


def _ddp_wrapped_names(script: ScriptModel) -> frozenset:
    return frozenset(
        binding.name
        for scope in script.scopes
        for bindings in scope.bindings.values()
        for binding in bindings
        if binding.kind == "assign" and binding.value is not None and _wraps_in_ddp(script, binding.value)
    )


def _wraps_in_ddp(script: ScriptModel, value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.IfExp):
        return _wraps_in_ddp(script, value.body) or _wraps_in_ddp(script, value.orelse)
    return script.is_call_to(value, v.DISTRIBUTED_DATA_PARALLEL)


# -- what a reference holds ---------------------------------------------------------------


def made_by_call(script: ScriptModel, expression: cst.BaseExpression, kind: str, makes: Callable[[cst.Call], bool]) -> Optional[cst.Call]:
    """The one call, accepted by `makes`, that made what `expression` holds
    (through aliases), when every binding in reach of that kind agrees on it."""
    made = {id(e.origin.value): e.origin.value for e in script.entities_of(expression) if e.kind == kind}
    if len(made) != 1:
        return None
    (value,) = made.values()
    return value if isinstance(value, cst.Call) and makes(value) else None


def has_no_length(script: ScriptModel, iterable: cst.BaseExpression) -> bool:
    """`len(iterable)` cannot work: it holds a generator, `iter`/`map`/`zip`/
    `filter`, or a DataLoader over an IterableDataset class of the file."""
    lengthless = script.derived(_LengthlessBindings)
    return any(lengthless.holds(binding) for binding in script.bindings_of_reference(iterable))


class _LengthlessBindings:
    """Which bindings hold something without a length, each decided once: a
    flat script rebinds `train_loader` in every copy of its loop, and each
    loop reads every one of those bindings."""

    def __init__(self, script: ScriptModel) -> None:
        self.script = script
        self._known: dict[int, tuple[object, bool]] = {}  # id(binding) -> (binding, verdict)

    def holds(self, binding) -> bool:
        known = self._known.get(id(binding))
        if known is None:
            known = self._known[id(binding)] = (binding, self._decide(binding))
        return known[1]

    def _decide(self, binding) -> bool:
        script = self.script
        value = binding.value if binding.kind == "assign" else None
        if isinstance(value, cst.GeneratorExp):
            return True
        if isinstance(value, cst.Call) and script.is_qualified(value.func, LENGTHLESS_CALLS):
            return True
        return bool(script.is_call_to(value, v.DATALOADER) and value.args and _is_lengthless_dataset(script, value.args[0].value))


def _is_lengthless_dataset(script: ScriptModel, dataset: cst.BaseExpression) -> bool:
    candidates = [dataset]
    if isinstance(dataset, (cst.Name, cst.Attribute)) and dotted_name(dataset):
        candidates += [b.value for b in script.bindings_of_reference(dataset) if b.kind == "assign" and b.value is not None]
    return any(
        isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and _is_iterable_dataset_class(script, value.func)
        for value in candidates
    )


def _is_iterable_dataset_class(script: ScriptModel, name: cst.Name, seen: frozenset = frozenset()) -> bool:
    """`name` is a class of the file deriving (through the file's classes too)
    from torch's IterableDataset; a user's own class of that name is not."""
    for binding in script.bindings_of(name.value, name):
        if binding.kind != "class" or binding.node in seen:
            continue
        for base in binding.node.bases:
            if script.is_qualified(base.value, v.ITERABLE_DATASET_BASES):
                return True
            if isinstance(base.value, cst.Name) and _is_iterable_dataset_class(script, base.value, seen | {binding.node}):
                return True
    return False


# -- how often things are named -----------------------------------------------------------


@dataclasses.dataclass
class Uses:
    """Counts over the whole file. `names`: each Name other than an attribute's
    name or an argument's keyword (definitions and targets included);
    `attributes`: `x.name`, by name; `subscripted`: `name[...]`, by name;
    `strings`: string keys that may name a value (dict literal keys,
    `name["key"]`, `name.get("key")`, `getattr(obj, "key")` and its kin)."""

    names: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    attributes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    subscripted: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    strings: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    @property
    def identifiers(self) -> set[str]:
        return set(self.names)

    @classmethod
    def of(cls, script: ScriptModel) -> "Uses":
        """One pass over the model's parent map (every node but the module)."""
        uses = cls()
        for node, parent in script.parents.items():
            if isinstance(node, cst.Name):
                if not (isinstance(parent, cst.Attribute) and parent.attr is node) and not (isinstance(parent, cst.Arg) and parent.keyword is node):
                    uses.names[node.value] += 1
            elif isinstance(node, cst.Attribute):
                uses.attributes[node.attr.value] += 1
            elif isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name):
                uses.subscripted[node.value.value] += 1
                uses._count(*(e.slice.value for e in node.slice if isinstance(e.slice, cst.Index)))
            elif isinstance(node, cst.DictElement):
                uses._count(node.key)
            elif isinstance(node, cst.Call):
                uses._count_arguments(node)
        return uses

    def _count_arguments(self, call: cst.Call) -> None:
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        if isinstance(call.func, cst.Name) and call.func.value in ATTRIBUTE_BY_STRING and len(positional) > 1:
            self._count(positional[1])
        elif method_of(call) == "get" and isinstance(call.func.value, cst.Name) and positional:
            self._count(positional[0])

    def _count(self, *nodes: cst.CSTNode) -> None:
        for node in nodes:
            if isinstance(node, cst.SimpleString) and isinstance(node.evaluated_value, str):
                self.strings[node.evaluated_value] += 1


__all__ = [
    "Uses",
    "anchors",
    "backward_calls",
    "ddp_models",
    "has_no_length",
    "is_known_optimizer_step",
    "made_by_call",
]
