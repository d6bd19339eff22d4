"""Where losses are stored across iterations (the accumulators), and what
the code does later with each accumulator as a whole.
"""

from __future__ import annotations

from typing import Iterator, Optional, Union

import libcst as cst

from .._base import code_of, walk
from .syntax import (
    STORING_METHODS,
    FRESH_CALLS,
    Expression,
    AccumulatorKey,
    Need,
    Verdict,
    NOTHING,
    unknown,
    is_number_literal,
    assigned_value,
    Store,
    always_run,
    first_line,
    accumulator_mentions,
)


class Stores:
    """Part of the analysis (see `analysis.Analysis`): stores and accumulators."""

    # -- 3. stores across iterations --------------------------------------------------

    def accumulators(self) -> dict[AccumulatorKey, list[Store]]:
        found: dict[AccumulatorKey, list[Store]] = {}
        if not self.losses:
            return found
        for store in self._stores():
            accumulator = self.accumulator_of(store.target)
            if (
                accumulator is not None
                and (store.atoms or store.opaque)
                and self._kept_across_iterations(store, accumulator)
            ):
                found.setdefault(accumulator, []).append(store)
        return found

    def _stores(self) -> Iterator[Store]:
        for call in self.nodes.calls:
            method = self.method(call)
            if method in STORING_METHODS or method == "update":
                if isinstance(self.parent(call), cst.Expr):
                    values = [arg.value for arg in call.args]
                    if method == "insert":
                        values = values[1:]
                    yield self._store(call, call.func.value, values, is_update=method == "update")
        for target, value, statement in self.nodes.bindings:
            if isinstance(statement, cst.AugAssign):
                yield self._store(statement, target, [value])
            elif isinstance(statement, cst.Assign) and isinstance(target, cst.Subscript):
                yield self._store(statement, target, [value])
            elif isinstance(statement, cst.Assign) and isinstance(target, (cst.Name, cst.Attribute)):
                itself = self.accumulator_of(target)
                mentions = [n for n in accumulator_mentions(value) if self.accumulator_of(n) == itself]
                if itself is not None and mentions:  # `running = running + loss`
                    yield self._store(statement, target, [value], exclude=mentions)

    def _store(self, node, target, values, is_update=False, exclude=()) -> Store:
        store = Store(node, target, values=list(values), is_update=is_update)
        for value in values:
            atoms, opaque = self.loss_atoms(value, frozenset(map(id, exclude)), store.carried)
            store.atoms.extend(atoms)
            store.opaque |= opaque
        return store

    def accumulator_of(self, target: cst.CSTNode) -> Optional[AccumulatorKey]:
        if isinstance(target, cst.Subscript):
            return self.accumulator_of(target.value)
        if isinstance(target, cst.Name):
            key = self.key(target)
            return ("name", *key) if key else None
        if isinstance(target, cst.Attribute):
            if self._is_self(target.value):
                return ("attr", target.attr.value)
            return ("other", code_of(target))
        return None

    def _is_self(self, node: cst.CSTNode) -> bool:
        """The first parameter of the method the node is in."""
        function = next(
            (a for a in self.codemod.ancestors(node) if isinstance(a, (cst.FunctionDef, cst.Lambda, cst.ClassDef))),
            None,
        )
        if not isinstance(function, cst.FunctionDef) or not isinstance(
            self.parent(self.parent(function)), cst.ClassDef
        ):
            return False
        parameters = [*function.params.posonly_params, *function.params.params]
        return bool(parameters) and isinstance(node, cst.Name) and parameters[0].name.value == node.value

    def _kept_across_iterations(self, store: Store, accumulator: AccumulatorKey) -> bool:
        statement = self.statement_of(store.node)
        loop = self.codemod.innermost_loop(statement)
        if loop is None:
            # an attribute or a global stored in a function outlives each call of it
            in_function = any(isinstance(a, (cst.FunctionDef, cst.Lambda)) for a in self.codemod.ancestors(statement))
            outlives = accumulator[0] != "name" or accumulator[1].kind == "module"
            return in_function and outlives
        return not self._reset_in(loop, accumulator)

    def _reset_in(self, loop: Union[cst.For, cst.While], accumulator: AccumulatorKey) -> bool:
        """Is the accumulator assigned afresh by a statement that every iteration runs?"""
        for statement in always_run(loop.body):
            if isinstance(statement, (cst.Assign, cst.AnnAssign)) and statement.value is not None:
                targets = (
                    [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
                )
                for target in targets:
                    if not isinstance(target, cst.Subscript) and self.accumulator_of(target) == accumulator:
                        if not any(
                            self.accumulator_of(n) == accumulator for n in accumulator_mentions(statement.value)
                        ):
                            return True
        return False

    # -- 4. what later code does with the accumulator ---------------------------------

    def later_uses(self, accumulator: AccumulatorKey, stores: list[Store]) -> Verdict:
        """What the code does with the accumulator, apart from these stores."""
        return self._accumulator_verdict(accumulator, [store.node for store in stores])

    def _accumulator_verdict(self, accumulator: AccumulatorKey, skip=()) -> Verdict:
        if accumulator in self._following:
            return NOTHING
        self._following.add(accumulator)
        try:
            if accumulator[0] == "attr":
                return self._attribute_verdict(accumulator[1], skip)
            if accumulator[0] == "other":
                return unknown(f"{accumulator[1]} belongs to an object whose other uses cannot be seen")
            return self._variable_verdict((accumulator[1], accumulator[2]), skip)
        finally:
            self._following.discard(accumulator)

    def _variable_verdict(self, key: tuple, skip) -> Verdict:
        verdict = NOTHING
        for binding in self.assignments(key):
            origin = self._origin(binding.node, key[1])
            if origin is not None:
                return unknown(origin)
        for read in self.reads(key):
            if not self.is_inside(read, skip):
                verdict |= self.classify(read)
        return verdict

    def bound_value(self, target: cst.CSTNode) -> tuple[Optional[Expression], Optional[cst.CSTNode]]:
        """(value, statement) of a name bound by `=`, `with ... as` or tuple
        unpacking of a literal (`a, b = [], []`); value None when the code does
        not show it (a loop variable, an unpacked call, an argument)."""
        path: list[int] = []
        node, holder = target, self.parent(target)
        while isinstance(holder, cst.Element):
            container = self.parent(holder)
            path.append(next(i for i, e in enumerate(container.elements) if e is holder))
            node, holder = container, self.parent(container)
        if isinstance(holder, (cst.AssignTarget, cst.AsName)):
            holder = self.parent(holder)
        value = assigned_value(node, holder)
        for index in reversed(path):
            elements = value.elements if isinstance(value, (cst.Tuple, cst.List)) else ()
            if index >= len(elements) or any(isinstance(e, cst.StarredElement) for e in elements):
                return None, holder
            value = elements[index].value
        return value, holder

    def _origin(self, node: cst.CSTNode, name: str) -> Optional[str]:
        """Where an accumulator's value comes from, when someone else may hold it too."""
        if isinstance(node, cst.Param) or isinstance(self.parent(node), cst.Param):
            return f"{name} is an argument, and the caller's uses cannot be seen"
        value, holder = self.bound_value(node)
        if isinstance(holder, cst.AugAssign):
            return None
        if value is None:
            return f"{name} is bound by `{first_line(self.statement_of(node))}`"
        if self._is_fresh(value) or any(isinstance(n, cst.Name) and n.value == name for n in walk(value)):
            return None
        return f"{name} is assigned {code_of(value)}, which others may also hold"

    def _is_fresh(self, value: Expression) -> bool:
        if is_number_literal(value) or isinstance(
            value, (cst.List, cst.Dict, cst.Set, cst.Tuple, cst.ListComp, cst.DictComp, cst.SetComp, cst.SimpleString)
        ):
            return True
        return isinstance(value, cst.Call) and self.codemod.is_call_to(value, FRESH_CALLS)

    def _attribute_verdict(self, attribute: str, skip) -> Verdict:
        verdict = NOTHING
        reads = 0
        for node in self.nodes.attributes:
            if node.attr.value != attribute or self.is_inside(node, skip):
                continue
            holder = self.parent(node)
            if isinstance(holder, cst.AssignTarget):
                statement = self.parent(holder)
                mentions_itself = any(
                    isinstance(n, cst.Attribute) and n.attr.value == attribute for n in walk(statement.value)
                )
                if not (self._is_fresh(statement.value) or mentions_itself):
                    return unknown(f"the attribute {attribute} is assigned {code_of(statement.value)}")
                continue
            use = self.classify(node)
            reads += use.need > Need.NONE
            verdict |= use
        if reads == 0:
            return unknown(f"the attribute {attribute} is not read in this file")
        return verdict
