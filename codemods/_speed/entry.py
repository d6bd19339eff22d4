"""Where a script starts: the place for settings made once per process."""

from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst

from ..script.uses import uses_of


@dataclasses.dataclass(frozen=True)
class Start:
    """Insert before `statement`: the first of the main guard's body, or the
    first module-level statement that does work in a flat script."""

    statement: cst.CSTNode


def script_start(script) -> Optional[Start]:
    """None when the file trains only when another module calls it (a library)."""
    entry = script.entry
    uses = uses_of(script)
    flat_training = [s for s in entry.flat if uses.trains(s)]
    if flat_training or (entry.main_guard is None and entry.flat):
        return Start(entry.flat[0])
    if entry.main_guard is not None:
        body = entry.main_guard.body
        if isinstance(body, cst.IndentedBlock) and body.body:
            return Start(body.body[0])
    return None


def attribute_set(script, names: frozenset) -> Optional[cst.CSTNode]:
    """The first attribute (or call) of the file whose qualified name is one of `names`."""
    for node in script.index.order:
        if isinstance(node, (cst.Attribute, cst.Call)):
            target = node.func if isinstance(node, cst.Call) else node
            if not script.qualified_names(target).isdisjoint(names):
                return node
    return None


__all__ = ["Start", "attribute_set", "script_start"]
