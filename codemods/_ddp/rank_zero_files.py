"""Files and folders under several ranks: work on a file that rank 0 alone
writes (copying, moving, replacing it) is rank 0's too, and a folder that
every rank creates at once is created without the race.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import append_keyword_args, has_star_args, keyword_arg, walk
from .queries import ScriptQueries

# Calls that work on a file they name: (keyword, position) of the file used,
# and of the file made (None: the call makes none).
FILE_WORK = {
    "shutil.copyfile": (("src", 0), ("dst", 1)),
    "shutil.copy": (("src", 0), ("dst", 1)),
    "shutil.copy2": (("src", 0), ("dst", 1)),
    "shutil.move": (("src", 0), ("dst", 1)),
    "os.rename": (("src", 0), ("dst", 1)),
    "os.replace": (("src", 0), ("dst", 1)),
    "os.remove": (("path", 0), None),
    "os.unlink": (("path", 0), None),
}
USED_PATH = {name: used for name, (used, _) in FILE_WORK.items()}
MADE_PATH = {name: made for name, (_, made) in FILE_WORK.items() if made is not None}
MAKE_DIRECTORY = {"os.mkdir": ("path", 0), "os.makedirs": ("name", 0)}
EXISTS = frozenset({"os.path.exists", "os.path.isdir"})


class RankZeroFiles(ScriptQueries):
    """Plans rank 0's work on the files it writes, and race-free folders."""

    def _plan_work_on_written(self, write: cst.CSTNode, path: cst.BaseExpression, reads: list[tuple[cst.Call, str]]) -> list:
        """Each later call in the write's function that works on `path` is
        rank 0's: every other rank has no such file (or not yet). Returns
        the (call, path made) of those planned, for the barriers of reads."""
        made = []
        code = self._code(path)
        for call in self._work_calls():
            used = self._path_argument(call, USED_PATH)
            if used is None or self._code(used) != code or not self._comes_before_in_same_function(write, call):
                continue
            if any(read_code == code and self._between(write, read, call) for read, read_code in reads):
                continue  # every rank reads it first: a barrier, then rank 0 alone (see the reads)
            statement = self._work_statement(call, write)
            if statement is None:
                self.report(
                    call, "AM525",
                    "work on a file that rank 0 alone writes above, in a one-line block: put it on its own line "
                    "(or under `if is_main_process():`), then run ddp again",
                )
                continue
            if (
                statement in self._guard_planned
                or self._plan_guard(statement, "work on a file rank 0 writes above")
                or self._inside_planned_guard(statement)
            ):
                self._rank_zero_work.add(call)
                target = self._path_argument(call, MADE_PATH)
                if target is not None:
                    made.append((call, target))
        return made

    def _work_calls(self) -> list[cst.Call]:
        if self._work is None:
            self._work = [c for c in self._uses.calls if self.is_call_to(c, FILE_WORK)]
        return self._work

    def _between(self, first: cst.CSTNode, middle: cst.CSTNode, last: cst.CSTNode) -> bool:
        return self._comes_before_in_same_function(first, middle) and self._comes_before_in_same_function(middle, last)

    def _work_statement(self, call: cst.Call, write: cst.CSTNode) -> Optional[cst.CSTNode]:
        """What goes under the guard for `call`: its line, or the `if` around
        it that does nothing but such output (ImageNet's `if is_best:
        shutil.copyfile(...)`), so that it joins the write's guard."""
        statement, _ = self._block_statement(call)
        if statement is None:
            return None
        while True:
            compound = self._if_around(statement)
            if (
                compound is None
                or self._position(compound) < self._position(write, end=True)
                or not self._only_output(compound)
                or self._may_communicate(compound) is not None
                or any(n in self._guard_planned for n in walk(compound))
            ):
                return statement
            statement = compound

    def _if_around(self, statement: cst.CSTNode) -> Optional[cst.If]:
        """The whole `if` statement (with its `elif`s) whose body holds `statement`."""
        block = self.parent(statement)
        owner = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if isinstance(owner, cst.Else):
            owner = self.parent(owner)
        if not isinstance(owner, cst.If):
            return None
        while isinstance(self.parent(owner), cst.If) and self.parent(owner).orelse is owner:
            owner = self.parent(owner)
        return owner

    def _only_output(self, compound: cst.If) -> bool:
        """Every line under the `if` prints, logs, writes or works on a file."""
        for node in walk(compound):
            if isinstance(node, cst.SimpleStatementLine):
                if not all(isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) for s in node.body):
                    return False
                if not all(self._output_kind(node, self._loggers) or self.is_call_to(s.value, FILE_WORK) for s in node.body):
                    return False
            elif isinstance(node, cst.BaseCompoundStatement) and not isinstance(node, cst.If):
                return False
        return True

    def _inside_planned_guard(self, node: cst.CSTNode) -> bool:
        return any(a in self._guard_planned for a in self.ancestors(node))

    # -- folders ------------------------------------------------------------------

    def _plan_directories(self) -> None:
        """`os.mkdir(d)` / `os.makedirs(d)` on every rank at once: the second
        rank finds the folder made (FileExistsError)."""
        for call in self._uses.calls:
            if not self.is_call_to(call, MAKE_DIRECTORY) or has_star_args(call) or self._exists_ok(call):
                continue
            statement, _ = self._block_statement(call)
            if statement is not None and (self._guarded_already(statement) or self._tolerates_existing(statement)):
                continue
            path = self._path_argument(call, MAKE_DIRECTORY)
            if path is not None and statement is not None and self._made_when_missing(statement, path):
                self._plan_exist_ok(call)
            else:
                self._plan_rank_zero_directory(call, statement)

    def _tolerates_existing(self, statement: cst.CSTNode) -> bool:
        """`try: os.mkdir(d)` / `except FileExistsError: pass`: safe on every rank already."""
        for ancestor in self._ancestors_in_function(statement):
            if isinstance(ancestor, cst.Try):
                return any(
                    all(isinstance(s, cst.SimpleStatementLine) and all(isinstance(p, cst.Pass) for p in s.body) for s in handler.body.body)
                    and (handler.type is None or any(n.value in ("FileExistsError", "OSError") for n in walk(handler.type) if isinstance(n, cst.Name)))
                    for handler in ancestor.handlers
                )
        return False

    def _exists_ok(self, call: cst.Call) -> bool:
        given = keyword_arg(call, "exist_ok")
        positional = [a for a in call.args if a.keyword is None]
        if given is None and self.is_call_to(call, {"os.makedirs"}) and len(positional) > 2:
            given = positional[2]
        return given is not None and isinstance(given.value, cst.Name) and given.value.value == "True"

    def _made_when_missing(self, statement: cst.CSTNode, path: cst.BaseExpression) -> bool:
        """`if not os.path.exists(path):` (or `isdir`) holds the line."""
        block = self.parent(statement)
        owner = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if not isinstance(owner, cst.If) or owner.body is not block:
            return False
        test = owner.test
        if not (isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and isinstance(test.expression, cst.Call)):
            return False
        checked = test.expression
        return (
            self.is_call_to(checked, EXISTS)
            and len(checked.args) == 1
            and checked.args[0].keyword is None
            and not checked.args[0].star
            and self._code(checked.args[0].value) == self._code(path)
        )

    def _plan_exist_ok(self, call: cst.Call) -> None:
        """Under `if not os.path.exists(d):` the folder is missing in a world of
        one, so `exist_ok=True` changes nothing there; across ranks, a rank that
        finds it made by another goes on."""
        is_mkdir = self.is_call_to(call, {"os.mkdir"})
        if is_mkdir and not isinstance(call.func, cst.Attribute):
            self.report(
                call, "AM537",
                "every rank creates this folder at once (FileExistsError on all but one): write "
                "`os.makedirs(..., exist_ok=True)` in place of `mkdir(...)`",
            )
            return

        def rewrite(updated: cst.Call) -> cst.Call:
            if is_mkdir:
                updated = updated.with_changes(func=updated.func.with_changes(attr=cst.Name("makedirs")))
                updated = updated.with_changes(
                    args=[a.with_changes(keyword=cst.Name("name")) if a.keyword is not None and a.keyword.value == "path" else a for a in updated.args]
                )
            return self._with_exist_ok(updated)

        def apply() -> None:
            self._edits[call] = rewrite

        self._step(call, "AM537", "`os.makedirs(..., exist_ok=True)`: every rank creates the folder at once", apply)

    @staticmethod
    def _with_exist_ok(call: cst.Call) -> cst.Call:
        old = keyword_arg(call, "exist_ok")
        if old is None:
            return append_keyword_args(call, [("exist_ok", cst.Name("True"))])
        return call.with_changes(args=[a.with_changes(value=cst.Name("True")) if a is old else a for a in call.args])

    def _plan_rank_zero_directory(self, call: cst.Call, statement: Optional[cst.CSTNode]) -> None:
        """A folder made without a check (it must not exist yet): rank 0 makes
        it, as the one process did, and the others wait until it exists."""
        if (
            statement is None
            or not isinstance(statement, cst.SimpleStatementLine)
            or not all(isinstance(s, cst.Expr) for s in statement.body)
            or any(isinstance(a, cst.Try) for a in self._ancestors_in_function(statement))
            or not self._runs_alike_on_every_rank(statement)
            or any(self._clashes(n) for n in self._uses.names.get("barrier", ()))
        ):
            self.report(
                call, "AM537",
                "every rank creates this folder at once (FileExistsError on all but one): create it on rank 0 "
                "(`if is_main_process():`), then `barrier()` on every rank, or pass `exist_ok=True`",
            )
            return
        if not self._plan_guard(statement, "creating a folder"):
            return

        def apply() -> None:
            self._after.setdefault(statement, []).append(self._barrier_statement())

        self._step(call, "AM537", "folder created on rank 0, then `barrier()`: the others wait until it exists", apply)

    def _barrier_statement(self) -> cst.BaseStatement:
        self._use("barrier")
        return cst.parse_statement(f"barrier(){self._module.default_newline}", config=self._config)

    def _ancestors_in_function(self, node: cst.CSTNode):
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Module)):
                return
            yield ancestor

    # -- a file read again in the next pass of a loop ------------------------------

    def _plan_barrier_after(self, write: cst.CSTNode, read: cst.Call) -> bool:
        """Rank 0 writes at the end of a pass that every rank reads back at the
        start of the next: a `barrier()` right after the write. False when
        `read` is no such read."""
        loop = self._loop_around_both(write, read)
        if loop is None:
            return False
        statement = next((a for a in self.ancestors(write) if a in self._guard_planned), write)
        if not self._runs_alike_on_every_rank(statement) or any(self._clashes(n) for n in self._uses.names.get("barrier", ())):
            self.report(
                read, "AM528",
                "every rank reads here, in the next pass of the loop, a file rank 0 alone writes below: call "
                "`dist.barrier()` on every rank right after that write",
            )
            return True
        if statement in self._barrier_after_planned:
            return True
        self._barrier_after_planned.add(statement)

        def apply() -> None:
            self._after.setdefault(statement, []).append(self._barrier_statement())

        self._step(read, "AM528", "`barrier()` after rank 0 writes the file every rank reads in the loop's next pass", apply)
        return True

    def _loop_around_both(self, write: cst.CSTNode, read: cst.Call) -> Optional[cst.CSTNode]:
        """The innermost loop of one function that holds `read` and, after it, `write`."""
        if self._position(read) > self._position(write):
            return None
        loops = []
        for ancestor in self.ancestors(read):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.Module)):
                break
            if isinstance(ancestor, (cst.For, cst.While)):
                loops.append(ancestor)
        written_in = set(self.ancestors(write))
        return next((loop for loop in loops if loop in written_in), None)
