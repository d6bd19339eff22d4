"""Running totals of a training loop combined across ranks after it (AM514).

Each rank's loop adds up its own share of every batch (`running_loss +=
loss.item() * x.size(0)`, `correct += (pred == y).sum().item()`), so what the
code after the loop prints, returns or decides on would be one rank's part:
an epoch's loss divided by the data set's length a world-size fraction of the
original's. Right after the loop, every rank takes the one-process total:
sums and counts added up (`sum_across_ranks`), per-batch means averaged
(`average_across_ranks`, each rank having added one mean per batch over its
share). Which is which is read by codemods/script/running_totals.py. With
`ddp=per-process` a rank's loop runs over fewer, whole batches, and a total
of per-batch means has no one-process counterpart: totals stay as they are.
"""

from __future__ import annotations

import libcst as cst

from .._syntax import walk
from ..script.running_totals import MEAN_PER_BATCH, running_totals
from .common import RUNTIME

COMBINERS = {MEAN_PER_BATCH: "average_across_ranks"}
SUMS = "sum_across_ranks"
COMBINED = frozenset(f"{RUNTIME}.{name}" for name in (SUMS, *COMBINERS.values()))


class RankTotals:
    def _plan_rank_totals(self, loop: cst.CSTNode) -> None:
        if self.per_process or not isinstance(loop, cst.For) or not self._runs_alike_on_every_rank(loop):
            return
        combined = self._combined_after(loop)
        totals = [total for total in running_totals(self.script, loop) if total.name not in combined]
        by_combiner: dict[str, list[str]] = {}
        for total in totals:
            by_combiner.setdefault(COMBINERS.get(total.kind, SUMS), []).append(total.name)
        if not by_combiner or any(self._clashes(n) for name in by_combiner for n in self._uses.names.get(name, ())):
            return
        statements = [
            cst.parse_statement(f"{', '.join(names)} = {combiner}({', '.join(names)}){self._module.default_newline}", config=self._config)
            for combiner, names in sorted(by_combiner.items())
        ]
        written = "; ".join(f"`{cst.Module([]).code_for_node(s.body[0])}`" for s in statements)

        def apply() -> None:
            self._use(*sorted(by_combiner))
            self._after.setdefault(loop, []).extend(statements)

        self._step(
            loop.target, "AM514",
            f"{written} after the loop: each rank adds up only its share of every batch, so the code after the loop "
            "reads the one-process total",
            apply,
        )

    def _combined_after(self, loop: cst.For) -> set[str]:
        """The names the statements right after the loop combine already (a migration run before)."""
        statements = list(self.parent(loop).body)
        names: set[str] = set()
        for statement in statements[statements.index(loop) + 1:]:
            assign = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
            if not isinstance(assign, cst.Assign) or not (isinstance(assign.value, cst.Call) and self.is_call_to(assign.value, COMBINED)):
                break
            names.update(n.value for target in assign.targets for n in walk(target.target) if isinstance(n, cst.Name))
        return names
