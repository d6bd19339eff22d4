"""Does the file need a guard: what a running statement does (with the
file's functions it calls) that a process importing the file must not repeat."""

from __future__ import annotations

import functools

import libcst as cst

from .._base import walk
from .statements import RUNS, Statement
from .syntax import assigned_names
from .vocabulary import PROCESS_STARTERS


class ScriptWork:
    """What running code does that needs the guard: starts processes, goes through a loader (a part of `FlatScript`)."""

    def work_of(self, statement: Statement) -> str:
        """What `statement` (with the file's functions it calls) does that a
        process importing the file must not repeat; "" for nothing."""
        places: list[cst.CSTNode] = [statement.node]
        places += [f.node.body for f in self.script.flow.called_functions([statement.node])]
        found = ""
        for place in places:
            for node in walk(place):
                if not isinstance(node, cst.Call):
                    continue
                if self.index.is_call_to(node, PROCESS_STARTERS):
                    return "it starts processes"
                if not found and self.script.is_dataloader(node) and self._goes_through(node, statement):
                    found = "it goes through a DataLoader"
        return found


    def _goes_through(self, loader: cst.Call, statement: Statement) -> bool:
        """Is the loader used while the script runs? One built in a function the
        script calls, or used where it is built (`for x in DataLoader(...)`),
        is; one bound to module-level names is when running code reads them.
        (A data module that only builds loaders for others to import is not.)"""
        if self.top_statement(loader) is not statement.node:
            return True
        targets = assigned_names(statement.node, loader)
        if targets is None:
            return True
        readers = [s for s in self.statements if s.kind == RUNS and s is not statement]
        return any(t in s.mentions for s in readers for t in targets) or not self._read_by_running_functions.isdisjoint(targets)

    @functools.cached_property
    def _read_by_running_functions(self) -> frozenset:
        """The module names that the file's functions called by running code read."""
        functions = self.script.flow.called_functions([s.node for s in self.statements if s.kind == RUNS])
        return frozenset(name for f in functions for name in self._module_names(self._names_in(f.node.body, at_import=False)))
