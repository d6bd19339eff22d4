"""What would break under the guard: AM121 (a definition reads, at import,
a name only the moved code sets) and AM122 (code that DataLoader workers run
depends on what moves)."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from .._base import walk
from .statements import RUNS
from .syntax import describe
from .vocabulary import DATA_PREFIXES, SENT_TO_WORKERS_PREFIXES


class Refusals:
    """The problems that make the codemod leave the file alone (a part of `FlatScript`)."""

    def import_time_problems(self) -> Iterator[tuple[cst.CSTNode, str, str]]:
        """AM121: a statement that stays reads, at import, a name that code
        before it, which moves, sets."""
        moving_before: dict[str, cst.CSTNode] = {}
        for statement in self.statements:
            if statement.kind == RUNS:
                for name in statement.binds:
                    moving_before.setdefault(name, statement.node)
                continue
            needed = sorted(name for name in statement.reads_at_import if name in moving_before)
            if needed:
                name = needed[0]
                yield statement.node, "AM121", (
                    f"{describe(statement.node)} reads `{name}` while the file is imported (a default argument, "
                    f"decorator, base class, class body or value), and `{name}` is set by code that runs the script "
                    f"(line {self.script.line(moving_before[name])}): under `if __name__ == \"__main__\":` that code "
                    f"would not run when a process imports the file, and the import would fail. Make it read "
                    f"`{name}` when it is called (e.g. a default of None, resolved inside), or pass it in; then "
                    "migrate again"
                )

    def worker_problems(self) -> Iterator[tuple[cst.CSTNode, str, str]]:
        """AM122: code that DataLoader workers run depends on what moves."""
        for definition in self._worker_code():
            top = self._by_node.get(self.top_statement(definition))
            name = definition.name.value
            if top is not None and top.kind == RUNS:
                yield definition, "AM122", (
                    f"`{name}` runs in DataLoader worker processes but is defined inside code that runs the script "
                    f"(line {self.script.line(top.node)}): workers that import the file would not find it once "
                    "that code is under the main guard; define it at module level, then migrate again"
                )
                continue
            for read in sorted(set(self._module_names(self._names_in(definition, at_import=False)))):
                setter = next((t for t, _ in self._binders.get(read, ()) if self._by_node.get(t) and self._by_node[t].kind == RUNS), None)
                if setter is not None:
                    yield definition, "AM122", (
                        f"`{name}` runs in DataLoader worker processes and reads the module variable `{read}`, set "
                        f"by code that runs the script (line {self.script.line(setter)}): under the main guard "
                        f"workers that import the file would not have it; pass `{read}` in (e.g. to the "
                        "constructor) instead, then migrate again"
                    )
                    break

    def _worker_code(self) -> list[cst.CSTNode]:
        """The file's classes and functions that may run in DataLoader
        workers: dataset and sampler classes, what is handed to a loader,
        a dataset or a transform, and what those call."""
        classes = [s.node for s in self.index.scopes if s.kind == "class"]
        found: dict[cst.CSTNode, None] = {}
        changed = True
        while changed:
            changed = False
            for cls in classes:
                if cls not in found and any(self._is_data_base(base.value, found) for base in cls.bases):
                    found[cls] = None
                    changed = True
        for scope in self.index.scopes:
            for call in scope.calls:
                if self._sends_to_workers(call, found):
                    for arg in call.args:
                        found.update(dict.fromkeys(self._definitions_handed_over(arg.value)))
        pending = list(found)
        while pending:
            for call in (n for n in walk(pending.pop()) if isinstance(n, cst.Call)):
                callee = self.script.flow.callee(call, self.index.scope_of(call))
                if callee is not None and callee[0].node not in found:
                    found[callee[0].node] = None
                    pending.append(callee[0].node)
        return sorted(found, key=lambda d: self.index.order.get(d, 0))

    def _is_data_base(self, base: cst.BaseExpression, data_classes: dict) -> bool:
        if any(q.startswith(DATA_PREFIXES) for q in self.index.qualified_names(base)):
            return True
        return any(d in data_classes for d in self._definitions_named(base))

    def _sends_to_workers(self, call: cst.Call, data_classes: dict) -> bool:
        if self.script.is_dataloader(call):
            return True
        if any(q.startswith(SENT_TO_WORKERS_PREFIXES) for q in self.index.qualified_names(call.func)):
            return True
        return any(d in data_classes for d in self._definitions_named(call.func))

    def _definitions_handed_over(self, value: cst.BaseExpression) -> Iterator[cst.CSTNode]:
        """The file's functions and classes an argument hands over: named
        (`collate_fn=pad`), instantiated (`MyData(...)`), or bound to the name
        passed (`train_set = MyData(...)`)."""
        for name in self._names_in(value, at_import=True):
            yield from self._definitions_named(name)
            for binding in self.index.bindings_of(name.value, self.index.scope_of(name)):
                if isinstance(binding.value, cst.Call):
                    yield from (d for d in self._definitions_named(binding.value.func) if isinstance(d, cst.ClassDef))

    def _definitions_named(self, expression: cst.BaseExpression) -> list[cst.CSTNode]:
        if not isinstance(expression, cst.Name):
            return []
        bindings = self.index.bindings_of(expression.value, self.index.scope_of(expression))
        return [b.node for b in bindings if b.kind in ("def", "class")]
