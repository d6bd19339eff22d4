"""A flat script's module-level statements, sorted into what stays and what
runs the script, and the guarded layout: the parts put together."""

from __future__ import annotations

from .order import GuardedLayout
from .refusals import Refusals
from .statements import ModuleStatements
from .work import ScriptWork


class FlatScript(GuardedLayout, Refusals, ScriptWork, ModuleStatements):
    """The module-level statements of a file, sorted into what stays and what
    runs the script, and the guarded layout."""


__all__ = ["FlatScript"]
