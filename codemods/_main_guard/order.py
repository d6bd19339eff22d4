"""Dependencies and order: which definitions may go above code that runs
before them, and the layout with the running code under guards."""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import libcst as cst

from ..script.scopes import Binding
from .statements import RUNS, SETUP, Statement
from .syntax import changed_roots, root_name
from .vocabulary import IMMUTABLE_RESULTS, LITERALS

_MAIN_TEST = cst.parse_expression('__name__ == "__main__"')


@dataclasses.dataclass
class _Run:
    """Running statements waiting for their guard, and what they do together."""

    statements: list = dataclasses.field(default_factory=list)
    mentions: set = dataclasses.field(default_factory=set)
    changes: set = dataclasses.field(default_factory=set)  # what they bind or may change
    state: set = dataclasses.field(default_factory=set)
    imports: bool = False
    calls: bool = False

    def add(self, statement: Statement, changes: frozenset) -> None:
        self.statements.append(statement)
        self.mentions |= statement.mentions
        self.changes |= changes
        self.state |= statement.state
        self.imports = self.imports or statement.imports
        self.calls = self.calls or statement.calls


class GuardedLayout:
    """The module body with the running code under guards (a part of `FlatScript`)."""

    def guarded_body(self) -> list[cst.BaseStatement]:
        """The module body with the running statements under guards: a
        statement that stays goes above the running code before it when the
        two are independent; else that code is guarded where it stands."""
        body: list[cst.BaseStatement] = []
        pending = _Run()
        for statement in self.statements:
            if statement.kind == RUNS:
                pending.add(statement, self._may_change(statement))
                continue
            moved_up = bool(pending.statements)
            if moved_up and (statement.kind == SETUP or not self._independent(statement, pending)):
                body.append(_guard(pending.statements, body[-1] if body else None))
                pending = _Run()
            body.append(_spaced(statement.node, body[-1]) if moved_up and body else statement.node)
        if pending.statements:
            body.append(_guard(pending.statements, body[-1] if body else None))
        return body

    def _independent(self, staying: Statement, running: "_Run") -> bool:
        """Can `staying` run before the running code, which came first, with the same effect?"""
        if staying.reads_at_import & running.changes:
            return False
        for name in staying.binds:
            if self._same_import_again(name, staying):
                continue
            # A name bound before may be read by the functions the running code calls.
            if name in running.mentions or name in running.changes or (running.calls and self._bound_before(name, staying)):
                return False
        if staying.state & running.state or (staying.imports and running.state) or (running.imports and staying.state):
            return False
        return True

    def _may_change(self, running: Statement) -> frozenset:
        """The module names whose value `running` may change: those it binds,
        the mutable ones whose objects it may change (see `changed_roots`);
        with a call, those the file's functions assign as globals."""
        changed = set(running.binds)
        for name in self._module_names(changed_roots(running.node)):
            binders = self._binders.get(name, ())
            if binders and not all(self._is_unchangeable(b) for _, b in binders):
                changed.add(name)
        if running.calls:
            changed |= self._assigned_as_globals
        return frozenset(changed)

    def _is_unchangeable(self, binding: Binding) -> bool:
        """Bound by an import, a def or a class, or to an immutable value:
        using it cannot change it (only binding it again can)."""
        if binding.kind in ("import", "def", "class"):
            return True
        return binding.kind == "assign" and binding.value is not None and self._is_immutable(binding.value)

    def _is_immutable(self, value: cst.BaseExpression) -> bool:
        """A number, string, bool, None, torch.device, path ... or a tuple,
        operation or condition over them; an attribute of a module."""
        if isinstance(value, (*LITERALS, cst.ConcatenatedString, cst.FormattedString)):
            return True
        if isinstance(value, cst.Name):
            return value.value in ("True", "False", "None")
        if isinstance(value, cst.Attribute):
            root = next(root_name(value), None)
            return root is not None and all(b.kind == "import" for b in self.index.bindings_of(root.value, self.index.scope_of(root)))
        if isinstance(value, cst.Call):
            names = self.index.qualified_names(value.func)
            return bool(names) and all(n in IMMUTABLE_RESULTS or n.startswith(("os.path.", "math.")) for n in names)
        if isinstance(value, cst.Tuple):
            return all(self._is_immutable(e.value) for e in value.elements)
        if isinstance(value, cst.IfExp):
            return self._is_immutable(value.body) and self._is_immutable(value.orelse)
        if isinstance(value, cst.BinaryOperation):
            return self._is_immutable(value.left) and self._is_immutable(value.right)
        if isinstance(value, cst.UnaryOperation):
            return self._is_immutable(value.expression)
        if isinstance(value, cst.BooleanOperation):  # one of its operands
            return self._is_immutable(value.left) and self._is_immutable(value.right)
        return isinstance(value, cst.Comparison)

    @functools.cached_property
    def _assigned_as_globals(self) -> frozenset:
        return frozenset(name for scope in self.index.scopes if scope.kind == "function" for name in scope.declared_global)

    def _bound_before(self, name: str, statement: Statement) -> bool:
        position = self._position[statement.node]
        return any(self._position.get(top, position) < position for top, _ in self._binders.get(name, ()))

    def _same_import_again(self, name: str, staying: Statement) -> bool:
        """`import numpy as np` when np already names numpy: binding it again changes nothing."""
        binders = self._binders.get(name, ())
        mine = [b for top, b in binders if top is staying.node]
        return bool(mine) and all(b.kind == "import" for _, b in binders) and len({b.qualified for _, b in binders}) == 1


def _guard(statements: Sequence[Statement], above: Optional[cst.CSTNode]) -> cst.If:
    """`if __name__ == "__main__":` around `statements`. The blank lines above
    the first one go above the `if` (at least one, two after a function or
    class); its comments stay with it, inside."""
    first = statements[0].node
    leading = list(first.leading_lines)
    blanks = 0
    while blanks < len(leading) and leading[blanks].comment is None:
        blanks += 1
    body = [_without_indented_blank_lines(first.with_changes(leading_lines=leading[blanks:]))]
    body += [_without_indented_blank_lines(s.node) for s in statements[1:]]
    if above is not None:
        blanks = max(blanks, 2 if isinstance(above, (cst.FunctionDef, cst.ClassDef)) else 1)
    return cst.If(test=_MAIN_TEST, body=cst.IndentedBlock(body=body), leading_lines=[cst.EmptyLine()] * blanks)


def _spaced(statement: cst.BaseStatement, above: cst.CSTNode) -> cst.BaseStatement:
    """A statement that now follows a function or class gets the two blank
    lines that separate top-level definitions; one that follows a guard, one."""
    if isinstance(above, (cst.FunctionDef, cst.ClassDef)):
        wanted = 2
    elif isinstance(above, cst.If) and above.test is _MAIN_TEST:
        wanted = 1
    else:
        return statement
    leading = list(statement.leading_lines)
    blanks = next((i for i, line in enumerate(leading) if line.comment is not None), len(leading))
    return statement.with_changes(leading_lines=[cst.EmptyLine()] * max(0, wanted - blanks) + leading)


def _without_indented_blank_lines(statement: cst.BaseStatement) -> cst.BaseStatement:
    """A module-level statement's blank lines inside the guard: empty (LibCST
    would give them the block's indentation), and one where there were
    several (two blank lines part top-level definitions, not lines of a block)."""
    lines: list[cst.EmptyLine] = []
    for line in statement.leading_lines:
        if line.comment is not None:
            lines.append(line)
        elif not lines or lines[-1].comment is not None:
            lines.append(line.with_changes(indent=False, whitespace=cst.SimpleWhitespace("")))
    return statement.with_changes(leading_lines=lines)
