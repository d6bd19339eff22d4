"""Loop exits decided the same on every rank: a `break` (or `return`) out of
a loop that trains, under an `if` on a value each rank computes for itself
(its own loss, an early-stopping counter), would leave the loop on one rank
while the others wait for it in the next all-reduce. The condition becomes
`rank_zero_decides(...)`: rank 0's value, on every rank. So does the test of
a `while` loop that trains.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import walk
from .common import RUNTIME, call_of, header
from .queries import ScriptQueries

DECIDES = frozenset({f"{RUNTIME}.rank_zero_decides"})
# Values every rank computes alike from the launch's arguments.
ARGUMENT_PARSERS = frozenset({"parse_args", "parse_known_args"})
LITERALS = (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString, cst.Imaginary)


class RankDecisions(ScriptQueries):
    """Plans `rank_zero_decides(...)` around per-rank loop conditions."""

    def _plan_rank_decisions(self) -> None:
        # Tests already wrapped in `rank_zero_decides` (fsdp's checkpoints plan some too).
        self._decisions_planned: set[cst.CSTNode] = getattr(self, "_decisions_planned", set())
        for node in self.script.index.order:
            if isinstance(node, (cst.Break, cst.Return)):
                self._plan_exit(node)
            elif isinstance(node, cst.While) and self._trains(node.body):
                self._plan_condition(node.test, node, header(node))

    def _plan_exit(self, exit_node: cst.CSTNode) -> None:
        loop = self.innermost_loop(exit_node)
        if loop is None or not self._trains(loop.body):
            return
        condition = self._condition_of(exit_node, loop)
        if condition is None:
            return
        nested = self._conditions_on_the_way(exit_node, loop)
        if nested is not None and len(nested) > 1 and not self._reached_alike(condition, loop):
            self._plan_nested_conditions(nested, loop)
            return
        self._plan_condition(condition.test, loop, condition.test)

    def _conditions_on_the_way(self, exit_node: cst.CSTNode, loop: cst.CSTNode) -> Optional[list[cst.If]]:
        """The `if` statements between the loop and the exit, outermost first,
        when nothing else lies between (blocks, `else:`, `elif`, `with`): once
        each is decided alike, every rank reaches the next as often."""
        found: list[cst.If] = []
        child = exit_node
        for ancestor in self.ancestors(exit_node):
            if ancestor is loop:
                return found[::-1] if child is loop.body else None
            if isinstance(ancestor, cst.If):
                if child is ancestor.test:
                    return None
                found.append(ancestor)
            elif not isinstance(ancestor, (cst.IndentedBlock, cst.With, cst.Else, cst.SimpleStatementLine, cst.SimpleStatementSuite)):
                return None
            child = ancestor
        return None

    def _plan_nested_conditions(self, conditions: list[cst.If], loop: cst.CSTNode) -> None:
        """`if val_loss < best: ... else: bad += 1; if bad >= patience: break`:
        the inner test is reached on the ranks where the outer one failed.
        Deciding each test on the way with rank 0's value (outermost first)
        sends every rank down rank 0's branches, so every rank reaches, and
        decides, the next test alike."""
        for condition in conditions:
            if self._decided_already(condition.test) or self._same_on_every_rank(condition.test):
                continue
            self._plan_decision(condition.test, condition.test, leads_to_exit=condition is not conditions[-1])

    def _condition_of(self, exit_node: cst.CSTNode, loop: cst.CSTNode) -> Optional[cst.If]:
        """The nearest `if` around the exit, inside the loop (None: it always exits)."""
        for ancestor in self.ancestors(exit_node):
            if ancestor is loop:
                return None
            if isinstance(ancestor, cst.If):
                return ancestor
        return None

    def _plan_condition(self, test: cst.BaseExpression, loop: cst.CSTNode, where: cst.CSTNode) -> None:
        if self._decided_already(test) or self._same_on_every_rank(test):
            return
        statement = self.parent(test)
        if not self._reached_alike(statement, loop):
            self.report(
                where, "AM511",
                "a loop that trains may end here on some ranks only, under a condition that is itself reached on "
                "some ranks only: compute the decision on every rank at one point, as rank 0's "
                "(`stop = torch.tensor(int(<condition>), device=device)`, then `dist.broadcast(stop, src=0)`), "
                "and exit on `stop.item()`",
            )
            return
        self._plan_decision(test, where)

    def _plan_decision(self, test: cst.BaseExpression, where: cst.CSTNode, leads_to_exit: bool = False) -> None:
        if test in self._decisions_planned:
            return  # the way to another exit
        self._decisions_planned.add(test)
        if any(self._clashes(n) for n in self._uses.names.get("rank_zero_decides", ())):
            self.report(
                where, "AM511",
                "this loop exit depends on a value each rank computes for itself: make every rank decide alike "
                "(`rank_zero_decides` is taken here: broadcast rank 0's decision with torch.distributed by hand)",
            )
            return

        def apply() -> None:
            self._use("rank_zero_decides")
            self._edits[test] = lambda updated: call_of("rank_zero_decides", updated)

        if leads_to_exit:
            message = (
                f"`rank_zero_decides({self._code(test)})`: every rank takes rank 0's branch here, so every rank "
                f"reaches the loop exit below, and decides it, alike"
            )
        else:
            message = (
                f"`rank_zero_decides({self._code(test)})`: every rank leaves the loop when rank 0 does (a rank "
                f"leaving alone would leave the others waiting in the next all-reduce)"
            )
        self._step(where, "AM511", message, apply)

    def _decided_already(self, test: cst.BaseExpression) -> bool:
        return isinstance(test, cst.Call) and self.is_call_to(test, DECIDES)

    def _reached_alike(self, statement: cst.CSTNode, loop: cst.CSTNode) -> bool:
        """Between the loop and `statement` (the `if` or the `while`) only
        blocks and `with` statements: every rank reaches it as often. An `elif`
        runs only where the tests before it failed."""
        if statement is loop:
            return True
        child = statement
        for ancestor in self.ancestors(statement):
            if ancestor is loop:
                return child is loop.body
            if not isinstance(ancestor, (cst.IndentedBlock, cst.With)):
                return False
            child = ancestor
        return False

    def _same_on_every_rank(self, test: cst.BaseExpression) -> bool:
        """Provably the same on every rank: literals, names of modules and
        builtins, counters of `range(...)` loops, constants, and the parsed
        command-line arguments; no calls."""
        for node in walk(test):
            if isinstance(node, cst.Call):
                return False
            if isinstance(node, cst.Name) and self._uses.is_read(node) and not self._uniform_name(node):
                return False
        return True

    def _uniform_name(self, name: cst.Name) -> bool:
        bindings = self.script.bindings_of(name.value, name)
        return all(self._uniform_binding(b) for b in bindings)

    def _uniform_binding(self, binding) -> bool:
        if binding.kind in ("import", "def", "class"):
            return True
        if binding.kind == "for":
            return isinstance(binding.statement, cst.For) and self._counts(binding.statement, binding.node)
        if binding.kind == "assign" and binding.value is not None:
            value = binding.value
            if isinstance(value, LITERALS) or (isinstance(value, cst.UnaryOperation) and isinstance(value.expression, LITERALS)):
                return True
            return (
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Attribute)
                and value.func.attr.value in ARGUMENT_PARSERS
            )
        return False

    def _counts(self, loop: cst.For, target: cst.CSTNode) -> bool:
        """`for i in range(...)`, or the index of `for i, batch in enumerate(...)`
        (a DistributedSampler gives every rank as many batches)."""
        iterable = loop.iter
        if not isinstance(iterable, cst.Call):
            return False
        if loop.target is target and self.is_call_to(iterable, {"builtins.range"}):
            return True
        return (
            self.is_call_to(iterable, {"builtins.enumerate"})
            and isinstance(loop.target, cst.Tuple)
            and bool(loop.target.elements)
            and loop.target.elements[0].value is target
        )
