"""What the `amp` codemod reads from a script beyond the shared model: every
call in source order, a source-order key for any node, and the names a
statement binds and reads (the autocast region takes in the statements a
loss is computed from).

Built once per model (`amp_facts(model)`), from the model's index: no walk
of the whole tree.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import dotted_name, walk
from .model import ScriptModel
from .flow import Function
from .scopes import Binding, Scope, children, positional_parameters

# Bindings whose target is a name or `a.b` that the statement stores to.
_STORING = frozenset({"assign", "augassign", "for", "with", "named", "except"})
# Subtrees whose names are neither read nor stored as values.
_NOT_VALUES = (cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal, cst.Del)

_latest: list = [None, None]  # [model, facts]: one file version at a time


class AmpFacts:
    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        index = model.index
        self.calls: list[cst.Call] = sorted((c for s in index.scopes for c in s.calls), key=index.order.__getitem__)
        self.nested: dict[Scope, list[Scope]] = {}  # scope -> its lambdas and comprehensions
        for scope in index.scopes:
            if scope.kind in ("lambda", "comprehension") and scope.parent is not None:
                self.nested.setdefault(scope.parent, []).append(scope)
        self.targets: dict[cst.CSTNode, Binding] = {
            b.node: b for s in index.scopes for bs in s.bindings.values() for b in bs if b.kind in _STORING
        }

    def calls_in(self, node: cst.CSTNode) -> list[cst.Call]:
        """The calls that the code of the function (or module) holding `node`
        makes, its lambdas and comprehensions included, in source order."""
        scope = self.model.index.scope_by_node.get(node) if isinstance(node, cst.FunctionDef) else self.scope_of(node)
        while scope.kind in ("lambda", "comprehension") and scope.parent is not None:
            scope = scope.parent
        found, pending = [], [scope]
        while pending:
            current = pending.pop()
            found.extend(current.calls)
            pending.extend(self.nested.get(current, ()))
        return sorted(found, key=self.model.index.order.__getitem__)

    def order(self, node: cst.CSTNode) -> int:
        """Where `node` starts, as a rank in source order."""
        order = self.model.index.order
        found = order.get(node)
        while found is None:
            kids = children(node)
            if not kids:
                return -1
            node = kids[0]
            found = order.get(node)
        return found

    def ends_before(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        """`first` is over before `second` starts."""
        return self.order(first) < self.order(second) and first not in self.model.ancestors(second) and first is not second

    def names_bound(self, node: cst.CSTNode) -> set:
        """Names and dotted names (`self.loss`) that `node` stores to."""
        return {self.targets[n].name for n in self._values(node) if n in self.targets}

    def names_read(self, node: cst.CSTNode) -> set:
        """Names and dotted names `node` reads (an augmented assignment's target too)."""
        found = set()
        for child in self._values(node):
            binding = self.targets.get(child)
            if binding is None or binding.kind == "augassign":
                found.add(dotted_name(child))
        found.discard("")
        return found

    def stored(self, node: cst.CSTNode) -> bool:
        """`node` is assigned to or deleted (`p.grad = None`, `del p.grad`), not read."""
        parent = self.model.parent(node)
        if isinstance(parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
            return node in self.targets
        if isinstance(parent, (cst.AssignTarget, cst.Del)):
            return True
        return isinstance(parent, (cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor)) and parent.target is node

    def _values(self, node: cst.CSTNode):
        """The names and attribute chains of `node` that denote values (not
        attribute names, keywords, imports), outside nested definitions."""
        skipped: set = set()
        for child in walk(node, into_definitions=False):
            if child in skipped:
                continue
            if isinstance(child, _NOT_VALUES):
                skipped.update(walk(child))
            elif isinstance(child, cst.Attribute):
                skipped.add(child.attr)
                yield child
            elif isinstance(child, cst.Arg) and child.keyword is not None:
                skipped.add(child.keyword)
            elif isinstance(child, cst.Name):
                yield child

    def scope_of(self, node: cst.CSTNode) -> Scope:
        """As the model's, for a line too: a line directly in a function's body
        has no scope of its own recorded, and its nearest recorded ancestor,
        the `def` statement, belongs to the scope around the function."""
        if isinstance(node, cst.SimpleStatementLine) and node.body:
            node = node.body[0]
        return self.model.scope_of(node)

    def function_at(self, node: cst.CSTNode) -> Optional[Function]:
        return self.model.flow.function_of(self.scope_of(node))

    def bindings_of(self, name: str, at: cst.CSTNode) -> list[Binding]:
        return self.model.index.bindings_of(name, self.scope_of(at))

    def self_attribute(self, klass: cst.ClassDef, attribute: str) -> list[Binding]:
        """The bindings of `self.<attribute>` in the methods of `klass`."""
        return self.model._entities.attribute_bindings(klass, attribute)

    def method_owner(self, node: cst.CSTNode) -> Optional[tuple]:
        """(ClassDef, name of the instance parameter) of the method whose code holds `node`."""
        function = self.function_at(node)
        instance = self.instance_parameter(function) if function is not None else None
        return (function.scope.parent.node, instance) if instance else None

    @staticmethod
    def instance_parameter(function: Function) -> Optional[str]:
        """`self` for a method called on an instance, else None."""
        positional = positional_parameters(function.node) if function.is_method else []
        return positional[0] if positional else None

    def methods(self, klass: cst.ClassDef) -> list[Function]:
        """The methods of a class of the file."""
        scope = self.model.index.scope_by_node[klass]
        functions = self.model.flow.functions
        return [functions[b.node] for bs in scope.bindings.values() for b in bs if b.kind == "def" and b.node in functions]


def amp_facts(model: ScriptModel) -> AmpFacts:
    if _latest[0] is not model:
        _latest[:] = [model, AmpFacts(model)]
    return _latest[1]


__all__ = ["AmpFacts", "amp_facts"]
