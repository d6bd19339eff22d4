"""What stays at module level: each module-level statement sorted into a
definition, a constant, process set-up, or code that runs the script, with
the module names it binds, mentions and reads while the file is imported."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator

import libcst as cst

from .._base import is_main_guard, walk
from ..script import ScriptModel
from ..script.flow import only_imports
from ..script.scopes import Binding, all_params, children
from .syntax import names_only, postpones_annotations, read_names, statements_in, suites_of, tests_of
from .vocabulary import (
    MODULE_DUNDERS,
    PROCESS_STATE,
    PURE_CALL_PREFIXES,
    PURE_CALLS,
    PURE_METHODS,
    SETUP_CALLS,
)

# Kinds of module-level statements.
DEFINITION = "definition"  # import, def, class, docstring: stays
CONSTANT = "constant"  # a cheap value bound to names: stays
SETUP = "setup"  # process set-up: stays, never moves across other code
RUNS = "runs"  # the script's work: goes under the guard


@dataclasses.dataclass(eq=False)
class Statement:
    """A module-level statement: what kind it is, and the module names it
    binds, mentions, and reads while the file is imported."""

    node: cst.BaseStatement
    kind: str
    binds: frozenset
    mentions: frozenset  # every module name it names, in nested functions too
    reads_at_import: frozenset  # for a definition: decorators, defaults, bases, class body, annotations
    state: frozenset  # the process state it touches (PROCESS_STATE entries)
    imports: bool
    calls: bool


class ModuleStatements:
    """The module-level statements of a file and their kinds (the base of `FlatScript`)."""

    def __init__(self, module: cst.Module, script: ScriptModel) -> None:
        self.module = module
        self.script = script
        self.index = script.index
        self.guards = [s for s in module.body if isinstance(s, cst.If) and is_main_guard(s.test)]
        self._top: dict[cst.CSTNode, cst.CSTNode] = {}  # a node's module-level statement, memoised
        self._binders = self._module_binders()
        self._bound_by: dict[cst.CSTNode, set[str]] = {}
        for name, binders in self._binders.items():
            for top, _ in binders:
                self._bound_by.setdefault(top, set()).add(name)
        self._postponed_annotations = postpones_annotations(module)
        kinds = self._kinds()
        self.statements = [self._statement(s, kinds[s]) for s in module.body if s not in self.guards]
        self._by_node = {s.node: s for s in self.statements}
        self._position = {node: i for i, node in enumerate(module.body)}

    # -- what each statement is ------------------------------------------------------

    def _module_binders(self) -> dict[str, list[tuple[cst.CSTNode, Binding]]]:
        """name -> (module-level statement, binding) for every module-level binding of it."""
        found: dict[str, list] = {}
        for name, bindings in self.index.module_scope.bindings.items():
            if "." not in name:
                found[name] = [(self.top_statement(b.node), b) for b in bindings]
        return found

    def top_statement(self, node: cst.CSTNode) -> cst.CSTNode:
        """The module-level statement that holds `node`."""
        if node in self._top:
            return self._top[node]
        path = [node]
        current = node
        while (parent := self.index.parent(current)) is not None and not isinstance(parent, cst.Module):
            if parent in self._top:
                current = self._top[parent]
                break
            current = parent
            path.append(current)
        for step in path:
            self._top[step] = current
        return current

    def _kinds(self) -> dict[cst.CSTNode, str]:
        """The kind of every statement. A constant or set-up statement that
        computes something other than a constant becomes RUNS, and so, in
        turn, do those that read what it binds."""
        kinds = {s: self._kind(s) for s in self.module.body if s not in self.guards}
        changed = True
        while changed:
            changed = False
            for statement, kind in kinds.items():
                if kind in (CONSTANT, SETUP) and not all(self._is_constant(e, kinds) for e in self._evaluated(statement)):
                    kinds[statement] = RUNS
                    changed = True
        return kinds

    def _kind(self, statement: cst.CSTNode) -> str:
        """The kind of a statement, if the values it computes are constants."""
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            return DEFINITION
        if isinstance(statement, cst.SimpleStatementLine):
            kinds = {self._small_kind(s) for s in statement.body}
            return next((k for k in (RUNS, SETUP, CONSTANT) if k in kinds), DEFINITION)
        if isinstance(statement, cst.Try) and only_imports(statement):
            return DEFINITION  # `try: import apex / except ImportError: ...`
        if isinstance(statement, (cst.If, cst.Try)):
            inner = {self._kind(s) for suite in suites_of(statement) for s in statements_in(suite)}
            return RUNS if inner & {RUNS, SETUP} else CONSTANT
        return RUNS

    def _small_kind(self, small: cst.BaseSmallStatement) -> str:
        if isinstance(small, (cst.Import, cst.ImportFrom, cst.Pass, cst.Global, cst.Nonlocal)):
            return DEFINITION
        if isinstance(small, cst.Expr):
            if isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString, cst.Ellipsis)):
                return DEFINITION
            return SETUP if self.index.is_call_to(small.value, SETUP_CALLS) else RUNS
        if isinstance(small, cst.Assign):
            if all(names_only(t.target) for t in small.targets):
                return CONSTANT
            return SETUP if len(small.targets) == 1 and self._is_environ_item(small.targets[0].target) else RUNS
        if isinstance(small, cst.AnnAssign):
            return CONSTANT if names_only(small.target) else RUNS
        if isinstance(small, cst.Raise):
            return CONSTANT  # inside a kept `if` or `try`: it stops the import either way
        return RUNS

    def _is_environ_item(self, target: cst.BaseExpression) -> bool:
        return isinstance(target, cst.Subscript) and self.index.is_qualified(target.value, {"os.environ"})

    def _evaluated(self, statement: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """What a constant or set-up statement computes: assigned values, the
        arguments of set-up calls, conditions."""
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign):
                    yield small.value
                    for target in (t.target for t in small.targets if self._is_environ_item(t.target)):
                        yield from target.slice
                elif isinstance(small, cst.AnnAssign) and small.value is not None:
                    yield small.value
                elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                    yield from (a.value for a in small.value.args)
                elif isinstance(small, cst.Raise) and small.exc is not None:
                    yield small.exc
        elif isinstance(statement, (cst.If, cst.Try)):
            yield from tests_of(statement)
            for suite in suites_of(statement):
                for inner in statements_in(suite):
                    yield from self._evaluated(inner)

    def _is_constant(self, node: cst.CSTNode, kinds: dict) -> bool:
        """A cheap expression that changes nothing, over names no running code binds."""
        if isinstance(node, cst.Name):
            return self._names_a_constant(node, kinds)
        if isinstance(node, cst.Call):
            return self._is_pure_call(node, kinds)
        if isinstance(node, (cst.Attribute, cst.Arg)):
            return self._is_constant(node.value, kinds)
        if isinstance(node, cst.Lambda):
            return all(self._is_constant(p.default, kinds) for p in all_params(node.params) if p.default is not None)
        if isinstance(node, (cst.Await, cst.Yield, cst.NamedExpr)):
            return False
        return all(self._is_constant(child, kinds) for child in children(node))

    def _names_a_constant(self, name: cst.Name, kinds: dict) -> bool:
        home = self.index.home_of(name.value, self.index.scope_of(name))
        if home is None:
            return name.value in MODULE_DUNDERS or self.index.qualified_names(name) != frozenset()
        if home is not self.index.module_scope:
            return True  # a comprehension's or lambda's own variable
        return all(kinds.get(top) != RUNS for top, _ in self._binders.get(name.value, ()))

    def _is_pure_call(self, call: cst.Call, kinds: dict) -> bool:
        names = self.index.qualified_names(call.func)
        pure = bool(names) and all(n in PURE_CALLS or n.startswith(PURE_CALL_PREFIXES) for n in names)
        if not pure and isinstance(call.func, cst.Attribute) and call.func.attr.value in PURE_METHODS:
            pure = self._is_constant(call.func.value, kinds) and not self._on_own_object(call.func)
        return pure and all(self._is_constant(arg.value, kinds) for arg in call.args)

    def _on_own_object(self, func: cst.Attribute) -> bool:
        """`x.get(...)` where `x` is the file's own object: its method may do anything."""
        root = func
        while isinstance(root, (cst.Attribute, cst.Call, cst.Subscript)):
            root = root.value if not isinstance(root, cst.Call) else root.func
        if not isinstance(root, cst.Name):
            return False
        return any(b.kind in ("def", "class") for _, b in self._binders.get(root.value, ()))

    def _statement(self, node: cst.BaseStatement, kind: str) -> Statement:
        mentions = frozenset(self._module_names(self._names_in(node, at_import=False)))
        return Statement(
            node=node,
            kind=kind,
            binds=frozenset(self._bound_by.get(node, ())),
            mentions=mentions,
            reads_at_import=frozenset(self._module_names(self._names_in(node, at_import=True))),
            state=frozenset(self._state_touched(node)),  # what runs at import: not function bodies
            imports=any(isinstance(n, (cst.Import, cst.ImportFrom)) for n in walk(node, into_definitions=False)),
            calls=any(isinstance(n, cst.Call) for n in walk(node)),
        )

    def _names_in(self, node: cst.CSTNode, at_import: bool) -> Iterator[cst.Name]:
        return read_names(node, at_import, self._postponed_annotations)

    def _module_names(self, names: Iterable[cst.Name]) -> Iterator[str]:
        module = self.index.module_scope
        for name in names:
            if self.index.home_of(name.value, self.index.scope_of(name)) is module:
                yield name.value

    def _state_touched(self, node: cst.CSTNode) -> Iterator[str]:
        for part in walk(node, into_definitions=False):
            if isinstance(part, (cst.Name, cst.Attribute)):
                for qualified in self.index.qualified_names(part):
                    yield from (state for state in PROCESS_STATE if qualified.startswith(state))
