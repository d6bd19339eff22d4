"""Uses of names and calls, shared by the codemods beyond the model itself
(ddp, sync-bn, device, item, workers): every call in source order, where
each name is read, and which calls lead to a backward pass.

`uses_of(model)` computes them once per model (one pass over the nodes the
model already ordered) and keeps them as long as the model lives.
"""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from .._syntax import walk
from .model import ScriptModel
from .scopes import Scope

FOLLOW_DEPTH = 3  # how many calls deep a function that trains is followed

# Where a Name is not a read: the attribute of `x.name`, the keyword of `f(name=...)`,
# the name of a parameter or definition.
_NAMED_BY = (cst.Param, cst.FunctionDef, cst.ClassDef)


def uses_of(model: ScriptModel) -> "Uses":
    return model.derived(Uses)


class Uses:
    """Calls in source order, the Name nodes of each spelling, and reads."""

    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        self.calls: list[cst.Call] = []
        self.names: dict[str, list[cst.Name]] = {}
        for node in model.index.order:  # source order
            if isinstance(node, cst.Call):
                self.calls.append(node)
            elif isinstance(node, cst.Name):
                self.names.setdefault(node.value, []).append(node)
        self._targets = {
            binding.node for scope in model.scopes for bindings in scope.bindings.values() for binding in bindings
        }
        self._in_imports = {node for statement in model.index.imports for node in walk(statement)}
        self._reads: dict[str, dict[Scope, list[cst.Name]]] = {}  # name -> home scope -> reads, filled per name
        self._self_reads: Optional[dict[tuple[cst.ClassDef, str], list[cst.Attribute]]] = None
        self._training_calls: Optional[set] = None
        self._training_holders: Optional[set] = None

    # -- reads ---------------------------------------------------------------------------

    def reads(self, name: str, home: Scope) -> list[cst.Name]:
        """The Names that read the binding of `name` in `home`, in source order."""
        by_home = self._reads.get(name)
        if by_home is None:
            by_home = self._reads[name] = self._reads_by_home(name)
        return list(by_home.get(home, ()))

    def _reads_by_home(self, name: str) -> dict[Scope, list[cst.Name]]:
        """Every read of `name`, grouped by the scope whose binding it reads:
        one pass over the name's uses, however many bindings ask."""
        index = self.model.index
        found: dict[Scope, list[cst.Name]] = {}
        for node in self.names.get(name, ()):
            if self.is_read(node):
                home = index.home_of(name, index.scope_of(node))
                if home is not None:
                    found.setdefault(home, []).append(node)
        return found

    def self_attribute_reads(self, klass: cst.ClassDef, attribute: str) -> list[cst.Attribute]:
        """`self.<attribute>` read (not assigned) in the code of `klass`."""
        if self._self_reads is None:
            self._self_reads = self._self_attribute_reads_by_class()
        return list(self._self_reads.get((klass, attribute), ()))

    def _self_attribute_reads_by_class(self) -> dict[tuple[cst.ClassDef, str], list[cst.Attribute]]:
        """(class, attribute) -> the `self.<attribute>` reads in the class's code
        (nested classes count for each class around them)."""
        found: dict[tuple[cst.ClassDef, str], list[cst.Attribute]] = {}
        for name in self.names.get("self", ()):
            parent = self.model.parent(name)
            if isinstance(parent, cst.Attribute) and parent.value is name and parent not in self._targets:
                for klass in self.model.ancestors(parent):
                    if isinstance(klass, cst.ClassDef):
                        found.setdefault((klass, parent.attr.value), []).append(parent)
        return found

    def is_read(self, name: cst.Name) -> bool:
        if name in self._targets or name in self._in_imports:
            return False
        parent = self.model.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            return False
        if isinstance(parent, cst.Arg) and parent.keyword is name:
            return False
        if isinstance(parent, _NAMED_BY) and parent.name is name:
            return False
        return not isinstance(parent, cst.NameItem)  # global / nonlocal

    # -- training ------------------------------------------------------------------------

    @property
    def backward_calls(self) -> list[cst.Call]:
        return [step.backward for step in self.model.training_steps]

    def trains(self, node: cst.CSTNode) -> bool:
        """Does running `node` call a backward, in it or through the file's own
        functions it calls (up to FOLLOW_DEPTH calls deep)?"""
        if self._training_holders is None:
            holders = set()
            for call in self.training_calls():
                holders.add(call)
                holders.update(self.model.ancestors(call))
            self._training_holders = holders
        return node in self._training_holders

    def training_calls(self) -> set:
        """The backward calls, and the calls of the file's functions that lead to one."""
        if self._training_calls is None:
            backwards = self.backward_calls
            training = set(backwards)
            trainers = {f for call in backwards for f in self._functions_around(call)}
            for _ in range(FOLLOW_DEPTH):
                sites = [site.call for f in self.model.functions if f.node in trainers for site in f.callers]
                training.update(sites)
                trainers |= {f for call in sites for f in self._functions_around(call)}
            self._training_calls = training
        return self._training_calls

    def _functions_around(self, node: cst.CSTNode) -> Iterator[cst.FunctionDef]:
        return (a for a in self.model.ancestors(node) if isinstance(a, cst.FunctionDef))


__all__ = ["FOLLOW_DEPTH", "Uses", "uses_of"]
