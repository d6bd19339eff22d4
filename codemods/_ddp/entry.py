"""Where the migrated script joins the process group (`init_distributed()`):
at the top of the `__main__` block, or before the first module-level code
that runs; and `--local_rank` flags that default to torchrun's LOCAL_RANK.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import keyword_arg, walk
from ..script.ddp_spelling import is_unbound, reads_import_of
from .common import RUNTIME, Insertion, Step, header, is_none, set_keyword
from .queries import ScriptQueries

LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


class ProcessGroupEntry(ScriptQueries):
    """Plans `init_distributed()` and the --local_rank default."""

    def _plan_init(self) -> None:
        if self._calls_to({f"{RUNTIME}.init_distributed"}):
            return
        main_block = self._main_block()
        if main_block is not None and not self._runs_at_import():
            first = main_block.body.body[0]
            anchor, insertion = first, Insertion(self._init_statement())
        else:
            anchor = self._first_statement_after_imports()
            if anchor is None:
                self.report(
                    self._module.body[-1] if self._module.body else self._module, "AM531",
                    "this file only defines things: join the process group (`dist.init_process_group()` under "
                    "torchrun) at the start of the program that uses them, before any model is wrapped or "
                    "DataLoader built",
                )
                return
            insertion = Insertion(self._init_statement(), take_leading="blank")

        def apply() -> None:
            self._use("init_distributed")
            self._before.setdefault(anchor, []).insert(0, insertion)

        # First, so that a suppressed set-up turns off the rest.
        self._steps.insert(0, Step(header(anchor), "AM501", "`init_distributed()`: joins the launch's process group here (left at exit, after an exception too); plain `python` runs a world of one", apply))

    def _init_statement(self) -> cst.BaseStatement:
        return cst.parse_statement(f"init_distributed(){self._module.default_newline}", config=self._config)

    def _main_block(self) -> Optional[cst.If]:
        guard = self.script.entry.main_guard
        return guard if guard is not None and isinstance(guard.body, cst.IndentedBlock) else None

    def _runs_at_import(self) -> bool:
        """Does module-level code (outside the `__main__` block) build models or
        loaders, train, or call the script's own functions and classes?"""
        entry = self.script.entry
        if entry.runs_at_import:
            return True
        flat = set(entry.flat)
        backwards = set(self._uses.backward_calls)
        return any(
            self._module_statement(call) in flat
            and (self._is_model_or_loader_call(call) or call in backwards or self._makes_own_class(call))
            for scope in self.script.scopes if _runs_in_module_code(scope)
            for call in scope.calls
        )

    def _makes_own_class(self, call: cst.Call) -> bool:
        return isinstance(call.func, cst.Name) and any(b.kind == "class" for b in self.script.bindings_of(call.func.value, call))

    def _module_statement(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The statement of the module's body that holds `node`."""
        for ancestor in self.ancestors(node):
            if self.parent(ancestor) is self._module:
                return ancestor
        return None

    def _first_statement_after_imports(self) -> Optional[cst.CSTNode]:
        """The first module-level statement that runs code (None in a file that only
        defines): join the group just before the first code that runs."""
        entry = self.script.entry
        return next((s for s in self._module.body if s is entry.main_guard or s in entry.flat), None)

    def _plan_local_rank(self) -> None:
        for node in self._uses.calls:
            if not (isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument"):
                continue
            flags = [a for a in node.args if a.keyword is None and isinstance(a.value, cst.SimpleString)]
            if not any(f.value.evaluated_value in LOCAL_RANK_FLAGS for f in flags):
                continue
            default = keyword_arg(node, "default")
            if default is not None and any(isinstance(n, cst.SimpleString) and "LOCAL_RANK" in n.value for n in walk(default.value)):
                continue
            if default is not None and not (_is_int_literal(default.value) or is_none(default.value)):
                self.report(node, "AM509", "`--local_rank` with a computed default: make it `int(os.environ.get(\"LOCAL_RANK\", ...))` by hand: torchrun passes the local rank in the environment, not as a flag")
                continue
            if not (reads_import_of(self.script, node, "os", "os") or is_unbound(self.script, node, "os")):
                self.report(node, "AM509", "`--local_rank`: `os` means something else here; give the flag the default `int(os.environ.get(\"LOCAL_RANK\", ...))` by hand: torchrun passes the local rank in the environment, not as a flag")
                continue
            if default is None or is_none(default.value):
                value = 'int(os.environ["LOCAL_RANK"]) if "LOCAL_RANK" in os.environ else None'
            else:
                value = f'int(os.environ.get("LOCAL_RANK", {self._code(default.value)}))'
            if self.fix(node, "AM509", "`--local_rank` defaults to the LOCAL_RANK environment variable: torchrun passes the local rank there, not as a flag"):
                self.add_import("os")
                expression = cst.parse_expression(value)
                self._edits[node] = lambda updated, e=expression: set_keyword(updated, "default", e)


def _runs_in_module_code(scope) -> bool:
    """The module's own code, or a lambda or comprehension in it."""
    while scope.kind in ("lambda", "comprehension"):
        scope = scope.parent
    return scope.kind == "module"


def _is_int_literal(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, cst.Integer)
