"""Writers and loggers on rank 0 only, with every use left where it is.

- A TensorBoard `SummaryWriter` is created on rank 0 alone; the other ranks
  hold a `NullWriter` (accelmigrate.runtime.rank_zero), whose methods write
  nothing. Every line that logs still runs on every rank, so a value it
  logs that needs a collective (a loss averaged across ranks) is computed
  as before: only the writing moves. Done where the writer is only called
  through its methods (`add_scalar`, `flush`, `close`), tested (`if writer
  is not None:`) or given to the script's own functions that do the same.
- `wandb.init(...)` runs in wandb's own `mode="disabled"` on the other
  ranks: `wandb.log`, `wandb.watch`, `run.log` and `wandb.finish` then do
  nothing there.
- A file opened for writing that cannot go under `if is_main_process():`
  (the `with` around the training loop that a `csv.writer` logs into, or
  `log = open(path, "w")`) is opened as `os.devnull` on the other ranks:
  what they write through it (`writer.writerow(...)`, `f.write(...)`) goes
  nowhere, and the file is written once.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import has_star_args, keyword_arg
from .common import RUNTIME, set_keyword
from .queries import ScriptQueries

SUMMARY_WRITERS = frozenset(
    {"torch.utils.tensorboard.SummaryWriter", "torch.utils.tensorboard.writer.SummaryWriter", "tensorboardX.SummaryWriter"}
)
WANDB_INIT = frozenset({"wandb.init"})
OPEN = frozenset({"builtins.open", "io.open"})
MAIN_PROCESS = frozenset({f"{RUNTIME}.is_main_process", "accelmigrate.runtime.env.is_main_process"})
NULL_WRITER = "NullWriter"
WRITER_METHODS_BESIDES_ADD = frozenset({"flush", "close"})


def opens_for_writing(call: cst.Call) -> bool:
    mode = _mode(call)
    return mode is not None and any(flag in mode for flag in "wax+")


def _mode(call: cst.Call) -> Optional[str]:
    positional = [a for a in call.args if a.keyword is None]
    given = keyword_arg(call, "mode") or (positional[1] if len(positional) > 1 else None)
    if given is None or not isinstance(given.value, cst.SimpleString):
        return None
    return given.value.evaluated_value


def _devnull_safe(call: cst.Call) -> bool:
    """Writing only (`w`, `a`, binary or text): os.devnull takes it; `x`
    would fail there and `+` would read back nothing."""
    mode = _mode(call)
    return mode is not None and any(flag in mode for flag in "wa") and not any(flag in mode for flag in "x+")


class RankZeroWriters(ScriptQueries):
    """Plans the writers, wandb runs and opened files that only rank 0 writes through."""

    # -- TensorBoard --------------------------------------------------------------

    def _plan_rank_zero_writer(self, call: cst.Call) -> None:
        if self._made_on_rank_zero_already(call):
            return
        target = self._bound_to(call)
        var = self._target_var(target) if target is not None else None
        if var is None:
            self.report(
                call, "AM528",
                "every rank would write the same TensorBoard events: bind the writer to a name, made on rank 0 "
                "only (`SummaryWriter(...)` where `dist.get_rank() == 0`, elsewhere an object whose methods do "
                "nothing)",
            )
            return
        misuse = next((r for r, _ in self._followed_references(var) if not self._writer_use_is_safe(r)), None)
        if misuse is not None or any(self._clashes(n) for n in self._uses.names.get(NULL_WRITER, ())):
            where = ""
            if misuse is not None:
                used = self.parent(misuse) if isinstance(self.parent(misuse), cst.Attribute) else misuse
                where = f" (`{self._code(used)}`, line {self._position(misuse)[0]}, uses more than its methods)"
            self.report(
                call, "AM528",
                f"every rank would write the same TensorBoard events{where}: create the writer with "
                "`SummaryWriter(...) if is_main_process() else None` and use it on rank 0 only",
            )
            return
        parenthesize = not isinstance(self.parent(call), (cst.Assign, cst.AnnAssign))

        def rewrite(updated: cst.Call) -> cst.BaseExpression:
            chosen = cst.IfExp(
                test=cst.parse_expression("is_main_process()"),
                body=updated,
                orelse=cst.parse_expression(f"{NULL_WRITER}()"),
            )
            return chosen.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if parenthesize else chosen

        def apply() -> None:
            self._use("is_main_process", NULL_WRITER)
            self._edits[call] = rewrite

        self._step(
            call, "AM528",
            f"TensorBoard writer on rank 0 only (`... if is_main_process() else NullWriter()`): every use of "
            f"`{var.code}` still runs on every rank, the other ranks write nothing",
            apply,
        )

    def _made_on_rank_zero_already(self, call: cst.Call) -> bool:
        parent = self.parent(call)
        return isinstance(parent, cst.IfExp) and parent.body is call and self._is_main_process_call(parent.test)

    def _is_main_process_call(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Call) and self.is_qualified(node.func, MAIN_PROCESS)

    def _bound_to(self, call: cst.Call) -> Optional[cst.BaseExpression]:
        """The name (or `self.<name>`) the writer is bound to: `w = SummaryWriter(...)`,
        through a conditional (`... if SummaryWriter is not None else None`), or `with ... as w`."""
        node, parent = call, self.parent(call)
        while isinstance(parent, cst.IfExp) and parent.test is not node:
            node, parent = parent, self.parent(parent)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and parent.value is node:
            return parent.targets[0].target
        if isinstance(parent, cst.AnnAssign) and parent.value is node:
            return parent.target
        if isinstance(parent, cst.WithItem) and parent.item is node and parent.asname is not None:
            return parent.asname.name
        return None

    def _writer_use_is_safe(self, reference: cst.CSTNode) -> bool:
        """A use that a NullWriter serves as the writer would: a call of one of
        its methods as a statement, a test of it, an argument of the script's
        own functions (whose uses are followed too)."""
        statement, _ = self._block_statement(reference)
        if statement is not None and (
            statement in self._guard_planned or self._guarded_already(statement) or self._inside_planned_guard(statement)
        ):
            return True  # rank 0's alone, where the writer is the real one
        parent = self.parent(reference)
        if isinstance(parent, cst.Attribute) and parent.value is reference:
            method = parent.attr.value
            called = self.parent(parent)
            return (
                isinstance(called, cst.Call)
                and called.func is parent
                and (method.startswith("add_") or method in WRITER_METHODS_BESIDES_ADD)
                and isinstance(self.parent(called), cst.Expr)
            )
        if isinstance(parent, cst.Arg):
            call = self.parent(parent)
            return isinstance(call, cst.Call) and not parent.star and self._calls_own_function(call)
        if isinstance(parent, cst.ComparisonTarget) or isinstance(parent, cst.Comparison):
            return True
        if isinstance(parent, (cst.If, cst.While)) and parent.test is reference:
            return True
        if isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
            return True
        if isinstance(parent, cst.IfExp) and parent.test is reference:
            return True
        return isinstance(parent, cst.WithItem) and parent.item is reference

    # -- wandb --------------------------------------------------------------------

    def _plan_wandb_init(self, call: cst.Call) -> None:
        mode = keyword_arg(call, "mode")
        if mode is not None and isinstance(mode.value, cst.IfExp) and self._is_main_process_call(mode.value.test):
            return
        if has_star_args(call):
            self.report(
                call, "AM528",
                "every rank would log the same wandb run: pass `mode=... if is_main_process() else \"disabled\"` "
                "to `wandb.init` by hand (its `**` arguments may hold a mode)",
            )
            return
        kept = mode.value if mode is not None else cst.Name("None")

        def rewrite(updated: cst.Call) -> cst.Call:
            old = keyword_arg(updated, "mode")
            value = old.value if old is not None else kept
            if isinstance(value, (cst.IfExp, cst.Lambda, cst.BooleanOperation)):
                value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return set_keyword(updated, "mode", cst.IfExp(test=cst.parse_expression("is_main_process()"), body=value, orelse=cst.SimpleString('"disabled"')))

        def apply() -> None:
            self._use("is_main_process")
            self._edits[call] = rewrite

        self._step(
            call, "AM528",
            "wandb run on rank 0 only: the other ranks' `wandb.init` is `mode=\"disabled\"`, so their "
            "`wandb.log(...)` calls log nothing",
            apply,
        )

    # -- files every rank would write -----------------------------------------------

    def _plan_devnull(self, call: cst.Call, kind_of_use: str) -> bool:
        """Open the file as os.devnull on ranks other than 0. False (with a
        finding) where that cannot be done."""
        if self._opened_on_rank_zero_already(call):
            return True
        path = next((a for a in call.args if a.keyword is None or a.keyword.value == "file"), None)
        clash = any("os" not in self.qualified_names(n) and not self._import_alias_of_os(n) for n in self._uses.names.get("os", ()))
        if path is None or path.star or has_star_args(call) or not _devnull_safe(call) or clash:
            self.report(
                call, "AM528",
                f"every rank writes this file at once ({kind_of_use}): open it on rank 0 only, e.g. "
                "`open(path if is_main_process() else os.devnull, \"w\")`",
            )
            return False

        def rewrite(updated: cst.Call) -> cst.Call:
            args = list(updated.args)
            index = next(i for i, a in enumerate(args) if a.keyword is None or a.keyword.value == "file")
            original = args[index].value
            if isinstance(original, (cst.IfExp, cst.Lambda)):
                original = original.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            chosen = cst.IfExp(
                test=cst.parse_expression("is_main_process()"), body=original, orelse=cst.parse_expression("os.devnull")
            )
            args[index] = args[index].with_changes(value=chosen)
            return updated.with_changes(args=args)

        def apply() -> None:
            self._use("is_main_process")
            self.add_import("os")
            self._edits[call] = rewrite

        self._step(
            call, "AM528",
            f"file opened on rank 0 only (the other ranks write to `os.devnull`): {kind_of_use}, and every rank "
            "writing it at once would garble it",
            apply,
        )
        return True

    def _opened_on_rank_zero_already(self, call: cst.Call) -> bool:
        return any(isinstance(a.value, cst.IfExp) and self._is_main_process_call(a.value.test) for a in call.args)

    def _import_alias_of_os(self, name: cst.Name) -> bool:
        return any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.ancestors(name))

    def _plan_open_files(self) -> list[tuple[cst.CSTNode, cst.BaseExpression]]:
        """Files opened for writing outside any rank-0 guard (`log = open(...)`,
        `csv.writer(open(...))`): opened as os.devnull on the other ranks.
        Returns (statement, path) of those planned, for the reads after them."""
        planned = []
        for call in self._uses.calls:
            if not self.is_call_to(call, OPEN) or not opens_for_writing(call):
                continue
            parent = self.parent(call)
            if isinstance(parent, cst.WithItem):
                continue  # a `with` statement: planned with the output statements
            statement, _ = self._block_statement(call)
            if statement is not None and (self._guarded_already(statement) or self._inside_planned_guard(statement)):
                continue
            if self._plan_devnull(call, "a file handle every rank writes through") and statement is not None:
                path = next(a.value for a in call.args if a.keyword is None or a.keyword.value == "file")
                planned.append((statement, path))
        return planned
