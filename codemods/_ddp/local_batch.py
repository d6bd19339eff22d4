"""The loader's batch size where the loop that trains shapes tensors with it
(`images.reshape(batch_size, -1)`, `torch.ones(batch_size, 1)`): once ddp
splits the batch across the processes, each step holds this process's share,
so those uses read `per_process_batch_size(batch_size)`. Other uses keep the
global batch (steps per epoch, a print cadence, a learning-rate rule).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import dotted_name, keyword_arg, walk
from .._shapes import is_shape_argument
from ..batch_scale import argparse_dest
from .common import call_of
from .queries import ScriptQueries

PER_PROCESS = frozenset({"accelmigrate.runtime.distributed.per_process_batch_size"})


class LocalBatchSize(ScriptQueries):
    """Plans `per_process_batch_size(...)` at the loop's shape arguments, and
    warns of a batch size that no even number of processes can split."""

    def _check_split_batch(self, call: cst.Call, batch: cst.BaseExpression) -> None:
        """A batch size known here (a literal, a constant, an argparse default)
        that two processes cannot split: `per_process_batch_size` would stop
        the launch, so say it before."""
        value = self._literal_value(batch)
        if self.per_process or value is None or value % 2 == 0:
            return
        code = self._code(batch)
        known = "" if isinstance(batch, cst.Integer) else f" (`{code}` is {value} here)"
        reason = "a batch of one cannot be split across processes" if value == 1 else "an odd batch cannot be split across an even number of processes"
        self.report(
            batch, "AM534",
            f"batch size {value}{known}: {reason}, and `per_process_batch_size` stops such a launch; launch with a batch "
            f"size divisible by the number of processes, or migrate with `--to ddp=per-process` to keep {value} per process",
        )

    def _literal_value(self, node: cst.BaseExpression) -> Optional[int]:
        """The integer `node` always is: a literal, a name assigned only that
        literal, or `args.<dest>` of an argparse argument with that default."""
        if isinstance(node, cst.Integer):
            return int(node.evaluated_value)
        if isinstance(node, cst.Name):
            values = {self._literal_value(v) if isinstance(v, cst.Integer) else None for v in self._assigned_values(node)}
            return values.pop() if len(values) == 1 else None
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
            arguments = [
                c for c in self._uses.calls
                if isinstance(c.func, cst.Attribute) and c.func.attr.value == "add_argument" and argparse_dest(c) == node.attr.value
            ]
            default = keyword_arg(arguments[0], "default") if len(arguments) == 1 else None
            return int(default.value.evaluated_value) if default is not None and isinstance(default.value, cst.Integer) else None
        return None

    def _splits_batch(self, loop: cst.CSTNode, batch: cst.BaseExpression) -> bool:
        # ddp=per-process keeps each process's batch: the loop's sizes stay right.
        return not self.per_process and isinstance(loop, cst.For) and bool(dotted_name(batch))

    def _plan_local_batch_sizes(self, loop: cst.CSTNode, batch: cst.BaseExpression) -> None:
        if not self._splits_batch(loop, batch):
            return
        for node in walk(loop.body):
            if self._reads_loader_batch(node, batch, loop) and self._is_shape_argument(node) and self.innermost_loop(node) is not None:
                self._plan_local_batch(node, batch)

    def _reads_loader_batch(self, node: cst.CSTNode, batch: cst.BaseExpression, loop: cst.For) -> bool:
        """`node`, in `loop`, reads the variable (`batch_size`, `args.batch_size`) the loader was given."""
        if not isinstance(node, (cst.Name, cst.Attribute)) or not dotted_name(batch) or dotted_name(node) != dotted_name(batch):
            return False
        if isinstance(node, cst.Name) and not self._uses.is_read(node):
            return False
        return self._root_var(node) == self._root_var(batch) and not self._rebound_in(batch, loop)

    def _rebound_in(self, batch: cst.BaseExpression, loop: cst.For) -> bool:
        """The loop binds the name itself (`for batch_size in ...`, `batch_size = ...`)."""
        name = dotted_name(batch)
        return any(
            isinstance(target, (cst.Name, cst.Attribute)) and dotted_name(target) == name
            for assign in walk(loop)
            if isinstance(assign, (cst.Assign, cst.AugAssign, cst.For))
            for target in _targets_of(assign)
        )

    def _is_shape_argument(self, node: cst.CSTNode) -> bool:
        return is_shape_argument(self, node, PER_PROCESS)

    def _plan_local_batch(self, node: cst.CSTNode, batch: cst.BaseExpression) -> None:
        code = self._code(batch)

        def apply() -> None:
            self._use("per_process_batch_size")
            self._edits[node] = lambda updated: call_of("per_process_batch_size", updated)

        self._step(
            node, "AM533",
            f"`per_process_batch_size({code})`: this step holds this process's share of the batch of `{code}` "
            f"that the DataLoader now splits across the processes",
            apply,
        )


def _targets_of(statement: cst.CSTNode) -> list[cst.CSTNode]:
    if isinstance(statement, cst.For):
        return list(walk(statement.target))
    if isinstance(statement, cst.AugAssign):
        return [statement.target]
    return [n for t in statement.targets for n in walk(t.target)]

