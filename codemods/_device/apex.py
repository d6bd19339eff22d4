"""NVIDIA apex imported behind `try: ... except ImportError: raise ...`: the
script refuses to start without apex, which needs CUDA. An apex import whose
names the file never reads only enforces that refusal, so it goes (and the
`try` with it when nothing else is left in it). `from apex import amp` in use
is the `amp` codemod's (it migrates apex amp to torch.amp and drops the
import); any other apex name in use (apex.parallel, apex.optimizers...) is
reported with its replacement."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from .._base import code_of

IMPORT_ERRORS = {"builtins.ImportError", "builtins.ModuleNotFoundError"}
AMP_CODEMODS = {"apex.amp"}  # migrated by the `amp` codemod
APEX_ADVICE = (
    "the script refuses to run without NVIDIA apex, which needs CUDA: replace `{name}` by hand "
    "(apex.parallel.DistributedDataParallel -> torch.nn.parallel.DistributedDataParallel, "
    "apex.optimizers.FusedAdam -> torch.optim.AdamW(fused=True), apex.parallel.SyncBatchNorm -> "
    "torch.nn.SyncBatchNorm; `--to amp` migrates apex amp), then drop the import"
)


class ApexPlans:
    """Mixed into the codemod: plans `self._removed` for apex imports that only refuse a run."""

    def _plan_apex_imports(self) -> None:
        for statement in self.facts.tries:
            if not self._refuses_without_import(statement):
                continue
            lines = list(self._apex_lines(statement))
            unused = [line for line in lines if self._apex_line_is_unused(line, statement)]
            for line in lines:
                if line not in unused:
                    self._report_apex_in_use(line, statement)
            if not unused:
                continue
            if not self.fix(unused[0], "AM315", "apex import that nothing reads, which only makes the script refuse to run without apex, removed"):
                continue
            whole = len(unused) == len(statement.body.body) and not statement.orelse and not statement.finalbody
            self._removed.update([statement] if whole else unused)

    def _refuses_without_import(self, statement: cst.Try) -> bool:
        """`try:` of import lines only, whose ImportError handler raises."""
        body = statement.body.body if isinstance(statement.body, cst.IndentedBlock) else ()
        if not body or not all(_import_line(line) for line in body):
            return False
        return any(self._catches_import_error(handler) and _raises(handler) for handler in statement.handlers)

    def _catches_import_error(self, handler: cst.ExceptHandler) -> bool:
        caught = handler.type
        if caught is None:
            return True
        names = [e.value for e in caught.elements] if isinstance(caught, cst.Tuple) else [caught]
        return any(self.is_qualified(name, IMPORT_ERRORS) for name in names)

    def _apex_lines(self, statement: cst.Try) -> Iterator[cst.SimpleStatementLine]:
        for line in statement.body.body:
            if any(_apex_module(small) for small in line.body):
                yield line

    def _apex_line_is_unused(self, line: cst.SimpleStatementLine, statement: cst.Try) -> bool:
        """Every name that `line` binds is never read (a star import binds unknown names)."""
        scope = self.script.scope_of(statement)
        names = [name for small in line.body for name in _bound_names(small)]
        return all(name is not None for name in names) and not any(
            self.facts.uses.reads(name, scope) for name in names
        )

    def _report_apex_in_use(self, line: cst.SimpleStatementLine, statement: cst.Try) -> None:
        scope = self.script.scope_of(statement)
        for small in line.body:
            for alias, name in zip(_aliases(small), _bound_names(small)):
                qualified = _qualified(small, alias)
                if qualified in AMP_CODEMODS:
                    continue
                if name is None or self.facts.uses.reads(name, scope):
                    self.report(alias if alias is not None else small, "AM315", APEX_ADVICE.format(name=qualified))


def _import_line(line: cst.CSTNode) -> bool:
    return isinstance(line, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in line.body)


def _raises(handler: cst.ExceptHandler) -> bool:
    body = handler.body.body if isinstance(handler.body, cst.IndentedBlock) else [handler.body]
    return any(isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) and any(isinstance(s, cst.Raise) for s in line.body) for line in body)


def _apex_module(small: cst.BaseSmallStatement) -> bool:
    if isinstance(small, cst.ImportFrom):
        module = code_of(small.module) if small.module is not None and not small.relative else ""
        return module == "apex" or module.startswith("apex.")
    if isinstance(small, cst.Import):
        return any(code_of(alias.name).split(".")[0] == "apex" for alias in small.names)
    return False


def _aliases(small) -> list:
    return [None] if isinstance(small.names, cst.ImportStar) else list(small.names)


def _bound_names(small) -> list[Optional[str]]:
    """The names an import binds; None for a star import's."""
    if isinstance(small.names, cst.ImportStar):
        return [None]
    found = []
    for alias in small.names:
        if alias.asname is not None:
            found.append(alias.asname.name.value)
        elif isinstance(small, cst.Import):
            found.append(code_of(alias.name).split(".")[0])
        else:
            found.append(alias.name.value)
    return found


def _qualified(small, alias) -> str:
    if isinstance(small, cst.Import):
        return code_of(alias.name)
    module = code_of(small.module)
    return f"{module}.*" if alias is None else f"{module}.{alias.name.value}"
