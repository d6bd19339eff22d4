"""Loop exits that one process may take alone: a `break` or `return` out of
a loop that trains, under a condition each process computes for itself (its
own loss), leaves the others waiting in DDP's next all-reduce. The ddp
codemod's reading of those conditions (codemods/_ddp/decisions.py) decides
which ones are the same on every process; accelerate refuses the others.
"""

from __future__ import annotations

import types

import libcst as cst

from .._base import code_of
from .._ddp.decisions import RankDecisions
from ..script.uses import uses_of
from .common import ACCELERATOR, CannotMigrate


class ExitReading:
    """ddp's RankDecisions, asked only whether a decision would be needed."""

    def __init__(self, codemod) -> None:
        self._codemod = codemod
        self.script = codemod.script
        self._uses = uses_of(codemod.script)

    def __getattr__(self, name: str):
        found = getattr(RankDecisions, name, None)
        if isinstance(found, types.FunctionType):
            return types.MethodType(found, self)
        return getattr(self._codemod, name)

    def refuse_per_process_exits(self) -> None:
        RankDecisions._plan_rank_decisions(self)

    def report(self, node: cst.CSTNode, code: str, message: str, fixed: bool = False) -> bool:
        self._refuse(node)

    def _plan_decision(self, test: cst.BaseExpression, where: cst.CSTNode, leads_to_exit: bool = False) -> None:
        self._refuse(where, test)

    def _refuse(self, where: cst.CSTNode, test=None) -> None:
        shown = f"`{code_of(test)}`" if test is not None else "a condition"
        raise CannotMigrate(
            where, "AM830",
            f"a loop that trains may end here on some processes only ({shown} is each process's own value): "
            f"accelerate changed nothing; decide it on every process alike (`stop = {ACCELERATOR}.gather(...)` of the "
            f"value, or rank 0's decision broadcast), then run accelerate again",
        )
