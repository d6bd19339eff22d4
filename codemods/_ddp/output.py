"""Output on rank 0 only: printing, logging and file writes go under
`if is_main_process():`, tqdm bars are hidden on the other ranks, and a
`barrier()` comes before every rank reads (or rank 0 removes) a file that
rank 0 wrote above. A `print` whose arguments may run collectives stays on
every rank and prints to a `NullWriter` on the others; writers, wandb runs
and files that cannot go under the guard are planned in writers.py.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import append_keyword_args, has_star_args, is_main_guard, keyword_arg, walk
from ..script import project_facts, vocabulary as v
from .common import RUNTIME, Insertion, Var, set_keyword
from .batch_norm import BatchNormNote
from .rank_zero_files import RankZeroFiles
from .writers import OPEN, SUMMARY_WRITERS, WANDB_INIT, RankZeroWriters, opens_for_writing as _opens_for_writing

TQDM = frozenset(
    {f"tqdm.{module}{name}" for module in ("", "auto.", "notebook.", "std.", "rich.") for name in ("tqdm", "trange")}
)
PRINT_LIKE = frozenset(
    {"builtins.print", "pprint.pprint", *(f"{name}.write" for name in TQDM if name.endswith(".tqdm"))}
)
LOGGING_CALLS = v.LOGGING_CALLS
FILE_WRITES = frozenset(
    {
        "torch.save",
        "numpy.save",
        "numpy.savez",
        "numpy.savez_compressed",
        "numpy.savetxt",
        "json.dump",
        "pickle.dump",
        "yaml.dump",
        "yaml.safe_dump",
        "matplotlib.pyplot.savefig",
    }
)
# Where each call names its file: (keyword, position among the positional arguments).
WRITTEN_PATH = {
    "torch.save": ("f", 1),
    "numpy.save": ("file", 0),
    "numpy.savez": ("file", 0),
    "numpy.savez_compressed": ("file", 0),
    "numpy.savetxt": ("fname", 0),
    "matplotlib.pyplot.savefig": ("fname", 0),
}
# How many calls deep the order of a read and the writes is followed.
MAX_CALL_DEPTH = 4
READ_PATH = {"torch.load": ("f", 0), "numpy.load": ("file", 0), "builtins.open": ("file", 0), "io.open": ("file", 0)}
# Calls after which the file is gone from its path.
REMOVED_PATH = {
    "os.remove": ("path", 0), "os.unlink": ("path", 0), "os.rename": ("src", 0), "os.replace": ("src", 0), "shutil.move": ("src", 0),
}


class RankZeroOutput(RankZeroFiles, RankZeroWriters, BatchNormNote):
    """Plans the rank-0 guards, hidden bars and barriers."""

    def _plan_download_first(self, call: cst.Call) -> None:
        """A data set downloaded where every rank builds it: rank 0 downloads
        first, the others then find the files (`with main_process_first():`).
        Only where every rank reaches the statement alike (its barriers need
        them all); elsewhere the finding says what to do."""
        statement = self._statement_holding(call)
        if statement is not None and self._within_main_process_first(statement):
            return  # migrated already
        if statement is None or not self._reached_by_every_rank(statement):
            self.report(
                call, "AM528",
                "`download=True` runs on every rank at once, into the same folder: download the data once "
                "before launching (or, where every rank reaches the statement, run it on rank 0 first: "
                "under `if dist.get_rank() == 0:`, then `dist.barrier()` on every rank, then on the others)",
            )
            return

        def apply() -> None:
            self._use("main_process_first")
            # a training loader's data set is hoisted into a statement of its own, which downloads first instead
            self._edits[statement] = lambda updated: updated if call in self._downloads_hoisted else _main_process_first(updated)

        self._step(
            call, "AM528",
            "`with main_process_first():` around the download: rank 0 downloads first, the other ranks then find "
            "the files instead of writing the same folder at once",
            apply,
        )

    def _download_first_if_needed(self, dataset: cst.BaseExpression, statement: cst.SimpleStatementLine) -> cst.BaseStatement:
        """The statement that a training loader's data set is hoisted into,
        under `with main_process_first():` if that data set downloads."""
        downloads = [n for n in walk(dataset) if isinstance(n, cst.Call) and _downloads(n)]
        if not downloads or not all(self._plans_download_first(n) for n in downloads):
            return statement
        self._downloads_hoisted.update(downloads)
        return _main_process_first(statement)

    def _plans_download_first(self, call: cst.Call) -> bool:
        statement = self._statement_holding(call)
        return statement is not None and not self._within_main_process_first(statement) and self._reached_by_every_rank(statement)

    def _statement_holding(self, node: cst.CSTNode) -> Optional[cst.SimpleStatementLine]:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.SimpleStatementLine):
                return ancestor
            if isinstance(ancestor, (cst.BaseCompoundStatement, cst.Lambda, cst.BaseComp)):
                return None  # a download in a condition, a lambda or a comprehension
        return None

    def _reached_by_every_rank(self, statement: cst.CSTNode) -> bool:
        """Code of a function or the module that every rank runs alike: no
        loop or `try` between the statement and its function (whose calls
        every rank makes as the original did), and only conditions that are
        the same on every rank (`if args.dataset == "mnist":`)."""
        for ancestor in self.ancestors(statement):
            if isinstance(ancestor, (cst.FunctionDef, cst.Module)):
                return True
            if isinstance(ancestor, cst.If) and self._same_on_every_rank(ancestor.test):
                continue
            if not isinstance(ancestor, (cst.IndentedBlock, cst.With, cst.Else)):
                return False
        return False

    def _within_main_process_first(self, statement: cst.CSTNode) -> bool:
        return any(
            isinstance(a, cst.With) and any(
                isinstance(item.item, cst.Call) and self.is_call_to(item.item, {f"{RUNTIME}.main_process_first"})
                for item in a.items
            )
            for a in self.ancestors(statement)
        )

    def _plan_rank_zero_output(self, models: list[Var]) -> None:
        self._loggers = loggers = self._logger_references()
        self._work: Optional[list[cst.Call]] = None
        self._reads: Optional[list[tuple[cst.Call, str]]] = None
        self._rank_zero_work: set[cst.Call] = set()
        self._barrier_after_planned: set[cst.CSTNode] = set()
        self._downloads_hoisted: set[cst.Call] = set()  # downloads in a hoisted data set, which downloads first
        # Where a model is called under any name: its forward may broadcast buffers.
        self._model_references = {r for model in models for r, _ in self._followed_references(model)}
        written: list[tuple[cst.CSTNode, cst.BaseExpression]] = []  # (what rank 0 alone writes, the file)
        writers = []  # planned once the guards are: a use under one is rank 0's
        for node in self._uses.calls:
            if self.is_call_to(node, TQDM):
                self._plan_tqdm(node)
            elif _downloads(node):
                self._plan_download_first(node)
            elif self.is_call_to(node, SUMMARY_WRITERS):
                writers.append(node)
            elif self.is_call_to(node, WANDB_INIT):
                self._plan_wandb_init(node)
        for statement in self._statements_with_called_output():
            kind = self._output_kind(statement, loggers)
            if kind == "a file write" and isinstance(statement, cst.With) and self._holds_more_than_output(statement):
                written.extend(self._plan_with_open_on_rank_zero(statement))
                continue
            if kind is None or not (self._plan_guard(statement, kind) or self._inside_planned_guard(statement)):
                continue
            path = self._written_path(statement) if kind == "a file write" else None
            if path is not None:
                written.append((statement, path))
                written.extend(self._plan_work_on_written(statement, path, self._every_rank_reads()))
        written.extend(self._plan_open_files())
        for writer in writers:
            self._plan_rank_zero_writer(writer)
        self._plan_directories()
        self._note_batch_norm(models)  # with the models' other per-rank consequences
        self._note_uneven_shares()
        self._note_rank_randomness(models)
        written.extend((call, None) for call in self._helper_writes())
        if written:
            self._plan_reads_after_writes(written)

    def _holds_more_than_output(self, statement: cst.With) -> bool:
        """A `with open(...)` around code every rank must run: the training
        loop (a `csv.writer` logging each epoch into it), collectives."""
        return self._may_communicate(statement.body) is not None or self._trains(statement.body)

    def _plan_with_open_on_rank_zero(self, statement: cst.With) -> list:
        """The files of the `with` opened as os.devnull on the other ranks."""
        written = []
        for item in statement.items:
            call = item.item
            if isinstance(call, cst.Call) and self.is_call_to(call, OPEN) and _opens_for_writing(call):
                if self._plan_devnull(call, "the `with` around it runs the training loop"):
                    path = self._path_argument(call, READ_PATH)
                    if path is not None:
                        written.append((statement, path))
        return written

    def _statements_with_called_output(self) -> list[cst.CSTNode]:
        """The statements that may print, log or write, in source order: a line
        with a call as a statement of its own, a `with` that opens something."""
        found: dict[cst.CSTNode, int] = {}
        order = self.script.index.order
        for call in self._uses.calls:
            parent = self.parent(call)
            if isinstance(parent, cst.Expr) and parent.value is call:
                line = self.parent(parent)
                found[line] = order[line.body[0]]
            elif isinstance(parent, cst.WithItem) and parent.item is call:
                statement = self.parent(parent)
                found[statement] = order[statement]
        return sorted(found, key=found.__getitem__)

    def _plan_tqdm(self, call: cst.Call) -> None:
        if has_star_args(call):
            self.report(call, "AM507", "tqdm with `**kwargs`: pass `disable=not is_main_process()` by hand")
            return
        disable = keyword_arg(call, "disable")
        if disable is not None and any(
            isinstance(n, cst.Call) and self.is_qualified(n.func, {f"{RUNTIME}.is_main_process"}) for n in walk(disable.value)
        ):
            return

        def rewrite(updated: cst.Call) -> cst.Call:
            hidden = cst.parse_expression("not is_main_process()")
            old = keyword_arg(updated, "disable")
            if old is None:
                return append_keyword_args(updated, [("disable", hidden)])
            # `X if is_main_process() else True`, not `X or not is_main_process()`: tqdm's
            # `disable=None` (off where the output is no terminal) must stay None on rank 0.
            value = old.value if not isinstance(old.value, (cst.IfExp, cst.Lambda)) else old.value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            combined = cst.IfExp(test=cst.parse_expression("is_main_process()"), body=value, orelse=cst.Name("True"))
            return updated.with_changes(args=[a.with_changes(value=combined) if a is old else a for a in updated.args])

        def apply() -> None:
            self._use("is_main_process")
            self._edits[call] = rewrite

        self._step(call, "AM507", "tqdm bar on rank 0 only: `disable=not is_main_process()` (a `disable=` given: kept on rank 0)", apply)

    def _output_kind(self, statement: cst.CSTNode, loggers: set[cst.CSTNode]) -> Optional[str]:
        if isinstance(statement, cst.With):
            for item in statement.items:
                if isinstance(item.item, cst.Call) and self.is_call_to(item.item, OPEN) and _opens_for_writing(item.item):
                    return "a file write"
            return None
        calls = [s.value for s in statement.body if isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)]
        for call in calls:
            if self.is_call_to(call, PRINT_LIKE):
                return "printing"
            if self.is_call_to(call, LOGGING_CALLS) or self._calls_a_logger(call, loggers):
                return "logging"
            if self.is_call_to(call, FILE_WRITES):
                return "a file write"
        return None

    def _is_output_statement(self, statement: cst.CSTNode) -> bool:
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        return all(
            isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and self.is_call_to(s.value, PRINT_LIKE | LOGGING_CALLS)
            for s in statement.body
        )

    def _calls_a_logger(self, call: cst.Call, loggers: set[cst.CSTNode]) -> bool:
        """`logger.info(...)` on a logger of this file or of a project module
        (`from utils import logger`), or a name bound to such a method, here
        (`print = logger.info`) or in a project module (`from utils import print`)."""
        func, imported = call.func, self.script.project.loggers
        if isinstance(func, cst.Attribute) and func.attr.value in v.LOG_LEVELS:
            return func.value in loggers or bool(self.qualified_names(func.value) & imported)
        if not isinstance(func, cst.Name):
            return False
        if self.qualified_names(func) & imported:
            return True
        bound = self.script.bindings_of(func.value, func)
        return bool(bound) and all(
            b.kind == "assign" and isinstance(b.value, cst.Attribute) and b.value.attr.value in v.LOG_LEVELS
            and (self.is_qualified(b.value.value, {"logging"}) or bool(self.qualified_names(b.value.value) & imported)
                 or any(self._is_logger_made(value) for value in self._values_of_name(b.value.value)))
            for b in bound
        )

    def _values_of_name(self, node: cst.BaseExpression) -> list:
        return self._assigned_values(node) if isinstance(node, cst.Name) else []

    def _is_logger_made(self, value: cst.BaseExpression) -> bool:
        return isinstance(value, cst.Call) and self.is_call_to(value, {"logging.getLogger"})

    def _logger_references(self) -> set[cst.CSTNode]:
        """Names bound to `logging.getLogger(...)` at module level, where used."""
        found: set[cst.CSTNode] = set()
        for statement in self._module.body:
            if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
                small = statement.body[0]
                if (
                    isinstance(small, cst.Assign)
                    and len(small.targets) == 1
                    and isinstance(small.targets[0].target, cst.Name)
                    and isinstance(small.value, cst.Call)
                    and self.is_call_to(small.value, {"logging.getLogger"})
                ):
                    var = self._target_var(small.targets[0].target)
                    found.update(reference for reference in self._references(var))
        return found

    def _plan_guard(self, statement: cst.CSTNode, kind: str) -> bool:
        if self._guarded_already(statement):
            return False
        problem = None
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) != 1:
            problem = f"{kind} shares its line with other statements: put it on its own line, then run ddp again"
        elif isinstance(statement, cst.SimpleStatementSuite) or not isinstance(self.parent(statement), (cst.IndentedBlock, cst.Module)):
            problem = f"{kind} in a one-line block: put it on its own line, then run ddp again"
        else:
            communicating = self._may_communicate(statement)
            if communicating is not None and self._plan_print_to_null_writer(statement, communicating):
                return False
            if communicating is not None:
                problem = (
                    f"{kind} that calls `{communicating}`, which may take part in collectives on every rank: compute "
                    f"that value on every rank first, then do the output under `if is_main_process():`"
                )
        if problem is not None:
            self.report(statement, "AM525", problem)
            return False

        self._guard_planned.add(statement)

        def apply() -> None:
            self._use("is_main_process")
            self._guarded.add(statement)

        self._step(statement, "AM506", f"{kind} under `if is_main_process():`, on rank 0 only", apply)
        return True

    def _plan_print_to_null_writer(self, statement: cst.CSTNode, communicating: str) -> bool:
        """`print(f"val {evaluate(model):.4f}")`: the arguments may run
        collectives, so every rank must still evaluate them; only rank 0's
        text reaches the terminal (`file=... if is_main_process() else
        NullWriter()`). False where the statement is no plain `print`."""
        call = statement.body[0].value if isinstance(statement.body[0], cst.Expr) else None
        if not isinstance(call, cst.Call) or not self.is_call_to(call, {"builtins.print"}) or has_star_args(call):
            return False
        if any(self._clashes(n) for n in self._uses.names.get("NullWriter", ())):
            return False
        old = keyword_arg(call, "file")
        if old is not None and isinstance(old.value, cst.IfExp) and self._is_main_process_call(old.value.test):
            return True  # migrated before

        def rewrite(updated: cst.Call) -> cst.Call:
            given = keyword_arg(updated, "file")
            shown = given.value if given is not None else cst.Name("None")
            if isinstance(shown, (cst.IfExp, cst.Lambda)):
                shown = shown.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            chosen = cst.IfExp(test=cst.parse_expression("is_main_process()"), body=shown, orelse=cst.parse_expression("NullWriter()"))
            return set_keyword(updated, "file", chosen)

        def apply() -> None:
            self._use("is_main_process", "NullWriter")
            self._edits[call] = rewrite

        where = "its file" if old is not None else "the terminal"
        self._step(
            statement, "AM525",
            f"printing that calls `{communicating}`, which may take part in collectives: every rank still computes "
            f"what is printed, only rank 0 writes it to {where} (`file=... if is_main_process() else NullWriter()`)",
            apply,
        )
        return True

    def _guarded_already(self, node: cst.CSTNode) -> bool:
        for ancestor in self.ancestors(node):
            if ancestor in self._guard_planned:
                return True
            if isinstance(ancestor, cst.If) and any(
                isinstance(n, cst.Call) and self.is_qualified(n.func, {f"{RUNTIME}.is_main_process", "accelmigrate.runtime.env.is_main_process"})
                for n in walk(ancestor.test)
            ):
                return True
        return False

    def _may_communicate(self, statement: cst.CSTNode) -> Optional[str]:
        """The first call in `statement` that might run a collective: the script's
        own functions, torch.distributed, or the model's forward."""
        for node in walk(statement):
            if not isinstance(node, cst.Call):
                continue
            names = self.qualified_names(node.func)
            if any(n.startswith(("torch.distributed.", f"{RUNTIME}.sum", f"{RUNTIME}.mean", f"{RUNTIME}.barrier")) for n in names):
                return self._code(node.func)
            if self._calls_own_function(node):
                return self._code(node.func)
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value == "forward":
                func = func.value
            if func in self._model_references:
                return self._code(node.func)
        return None

    def _every_rank_reads(self) -> list[tuple[cst.Call, str]]:
        """The calls that read a file they name, with the file's code."""
        if self._reads is None:
            self._reads = [
                (call, self._code(path))
                for call in self._uses.calls
                for path in [self._path_argument(call, READ_PATH)]
                if path is not None and not (self.is_call_to(call, OPEN) and _opens_for_writing(call))
            ]
        return self._reads

    def _plan_reads_after_writes(self, writes: list[tuple[cst.CSTNode, cst.BaseExpression]]) -> None:
        """Every rank that reads (or removes) a file rank 0 writes earlier in the
        same function waits for it at a `barrier()` first; removal is rank 0's
        alone, once every rank has read it. A read in a loop of a file written
        later in the loop waits at a `barrier()` after the write."""
        # A helper module's write (path None) may have written any file.
        written = [(w, self._code(path) if path is not None else None) for w, path in writes]
        for node in self._uses.calls:
            if node in self._rank_zero_work:
                continue
            removal = self.is_call_to(node, REMOVED_PATH)
            path = self._path_argument(node, REMOVED_PATH if removal else READ_PATH)
            if path is None or (not removal and self.is_call_to(node, OPEN) and _opens_for_writing(node)):
                continue
            same = [w for w, code in written if code is None or code == self._code(path)]
            if not any(self._written_before(w, node) for w in same):
                if not removal and any(self._plan_barrier_after(w, node) for w in same):
                    continue
                if self.is_call_to(node, v.TORCH_LOAD) and not self._reads_before_every_write(node, [w for w, _ in written]):
                    self.report(
                        node, "AM528",
                        "rank 0 alone writes checkpoints now: if this reads one written during this run, call "
                        "`dist.barrier()` on every rank between the save and the load",
                    )
                continue
            self._plan_barrier_before(node, removal)

    def _helper_writes(self) -> list[cst.Call]:
        """The calls of a helper module's function or class that writes a file
        on rank 0 alone now (the fact `rank_zero_writers`): the function, the
        class, or an instance of it (`stopper(val_loss, model)` with `stopper =
        EarlyStopping(...)`)."""
        writers = project_facts.current().rank_zero_writers if self.reads_handoffs else frozenset()
        found = []
        for call in self._uses.calls if writers else ():
            root = call.func.value if isinstance(call.func, cst.Attribute) else call.func
            made = self._made_by_call(root)
            if self.qualified_names(call.func) & writers or (made is not None and self.qualified_names(made.func) & writers):
                found.append(call)
        return found

    def _written_path(self, write: cst.CSTNode) -> Optional[cst.BaseExpression]:
        if isinstance(write, cst.With):
            opened = next(
                i.item for i in write.items
                if isinstance(i.item, cst.Call) and self.is_call_to(i.item, OPEN) and _opens_for_writing(i.item)
            )
            return self._path_argument(opened, READ_PATH)
        call = write.body[0].value if isinstance(write.body[0], cst.Expr) else None
        return self._path_argument(call, WRITTEN_PATH) if isinstance(call, cst.Call) else None

    def _path_argument(self, call: cst.Call, where: dict) -> Optional[cst.BaseExpression]:
        """The file `call` names, when it is one of `where`'s functions."""
        name = next((n for n in self.qualified_names(call.func) if n in where), None)
        if name is None or has_star_args(call):
            return None
        keyword, position = where[name]
        positional = [a for a in call.args if a.keyword is None]
        given = keyword_arg(call, keyword) or (positional[position] if len(positional) > position else None)
        return given.value if given is not None else None

    def _reads_before_every_write(self, read: cst.Call, writes: list) -> bool:
        """Can no write of this run have happened when `read` runs? Each write
        comes later in the read's own function, or in a function that the
        file calls only from there, later; and no loop runs both (a resume at
        start-up, a pretrained model loaded before training), and the read
        runs once (a function called per fold would read the last fold's)."""
        return self._runs_once(read) and all(self._runs_only_after(write, read) for write in writes)

    def _runs_once(self, node: cst.CSTNode, depth: int = 0) -> bool:
        if any(isinstance(a, (cst.For, cst.While)) for a in self._ancestors_in_function(node)):
            return False
        function = self.script.function_at(node)
        if function is None:
            return True
        return len(function.callers) == 1 and depth < MAX_CALL_DEPTH and self._runs_once(function.callers[0].call, depth + 1)

    def _ancestors_in_function(self, node: cst.CSTNode) -> list:
        found = []
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                break
            found.append(ancestor)
        return found

    def _runs_only_after(self, later: cst.CSTNode, read: cst.CSTNode) -> bool:
        def after_the_read(node: cst.CSTNode) -> Optional[bool]:
            if not self._comes_before_in_same_function(read, node):
                return None
            loops = {id(a) for a in self.ancestors(read) if isinstance(a, (cst.For, cst.While))}
            return not any(id(a) in loops for a in self.ancestors(node))

        return self._settled_on_every_way_to(later, after_the_read)

    def _written_before(self, write: cst.CSTNode, read: cst.CSTNode) -> bool:
        """Does `write` run before `read` on the way to it: earlier in the read's own function, or earlier than
        every call of that function (`test(model)` after the training loop that saves the best weights), each
        call reached alike on every rank, so that a `barrier()` before the read meets them all?"""
        return self._settled_on_every_way_to(
            read, lambda node: True if self._comes_before_in_same_function(write, node) else None, self._call_reached_alike
        )

    def _settled_on_every_way_to(self, node: cst.CSTNode, settle, call_allowed=None, depth: int = 0) -> bool:
        """`settle(node)` where it says True or False; where it says None, the same asked of every call of the
        function `node` is in (each one `call_allowed`), up to MAX_CALL_DEPTH calls out; False at the top."""
        settled = settle(node)
        if settled is not None:
            return settled
        function = self.script.function_at(node)
        if function is None or not function.callers or depth >= MAX_CALL_DEPTH:
            return False
        return all(
            (call_allowed is None or call_allowed(site.call)) and self._settled_on_every_way_to(site.call, settle, call_allowed, depth + 1)
            for site in function.callers
        )

    def _call_reached_alike(self, node: cst.CSTNode) -> bool:
        statement, _ = self._block_statement(node)
        return statement is not None and self._runs_alike_on_every_rank(statement)

    def _comes_before_in_same_function(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        def function(node: cst.CSTNode) -> Optional[cst.CSTNode]:
            return next((a for a in self.ancestors(node) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)

        return function(first) is function(second) and self._position(first, end=True) <= self._position(second)

    def _plan_barrier_before(self, call: cst.Call, removal: bool) -> None:
        what = "removes" if removal else "reads"
        statement, _ = self._block_statement(call)
        if statement is None or not self._runs_alike_on_every_rank(statement) or any(
            self._clashes(n) for n in self._uses.names.get("barrier", ())
        ):
            self.report(
                call, "AM528",
                f"every rank {what} a file that rank 0 alone writes earlier: call `dist.barrier()` "
                f"on every rank between the write and this line"
                + (", and remove the file on rank 0 only (after a `dist.barrier()` that follows every read)" if removal else ""),
            )
            return
        if removal and not self._plan_guard(statement, "removing a file rank 0 wrote"):
            return
        if statement in self._barrier_planned or self._follows_a_barrier(statement):
            return
        self._barrier_planned.add(statement)

        def apply() -> None:
            self._before.setdefault(statement, []).append(Insertion(self._barrier_statement(), take_leading="all"))

        if removal:
            message = "`barrier()` before rank 0 removes the file it wrote above: every rank has read it by then"
        else:
            message = "`barrier()` before every rank reads the file rank 0 writes above: it is written by then"
        self._step(call, "AM528", message, apply)

    def _follows_a_barrier(self, statement: cst.CSTNode) -> bool:
        """The statement before `statement` in its block is a `barrier()` (a migration run before)."""
        block = list(self.parent(statement).body)
        index = block.index(statement)
        before = block[index - 1] if index > 0 else None
        return (
            isinstance(before, cst.SimpleStatementLine) and len(before.body) == 1 and isinstance(before.body[0], cst.Expr)
            and isinstance(before.body[0].value, cst.Call) and self.is_qualified(before.body[0].value.func, {f"{RUNTIME}.barrier"})
        )

    def _runs_alike_on_every_rank(self, statement: cst.CSTNode) -> bool:
        """Does every rank reach `statement` as often as the others? Provably when
        nothing between it and its function branches: only `for` and `with`
        bodies (a DistributedSampler gives every rank as many batches), or the
        `__main__` block."""
        child = statement
        for ancestor in self.ancestors(statement):
            if isinstance(ancestor, (cst.FunctionDef, cst.Module)):
                return True
            if isinstance(ancestor, cst.If) and is_main_guard(ancestor.test) and child is ancestor.body:
                pass
            elif isinstance(ancestor, cst.For) and child is not ancestor.body:
                return False
            elif not isinstance(ancestor, (cst.IndentedBlock, cst.For, cst.With)):
                return False
            child = ancestor
        return True


def _main_process_first(statement: cst.CSTNode) -> cst.With:
    """`with main_process_first():` around `statement`, where it stood."""
    inner = statement.with_changes(leading_lines=[])
    return cst.With(
        items=[cst.WithItem(cst.parse_expression("main_process_first()"))],
        body=cst.IndentedBlock(body=[inner]),
        leading_lines=statement.leading_lines,
    )


def _downloads(call: cst.Call) -> bool:
    """`datasets.MNIST(..., download=True)`."""
    download = keyword_arg(call, "download")
    return download is not None and isinstance(download.value, cst.Name) and download.value.value == "True"
