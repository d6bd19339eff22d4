"""`init_process_group("nccl")`, a `--dist-backend` flag defaulting to "nccl"
and a backend variable assigned "nccl" (`args.dist_backend = "nccl"`): NCCL
needs a GPU, so a script that names it cannot start its process group on a
CPU. The runtime's `default_backend()` is "nccl" wherever the script computes
on CUDA and "gloo" elsewhere."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import keyword_arg
from .literals import BACKEND_MODULE, DEFAULT_BACKEND, INIT_PROCESS_GROUP, last_name, method_name, positional, string_value

BACKEND_FLAGS = ("--dist-backend", "--dist_backend", "--backend")
BACKEND_ADVICE = (
    "process-group backend hard-coded to \"nccl\", which needs a GPU: pass `default_backend()` "
    f"({BACKEND_MODULE}: nccl with CUDA, gloo without) by hand"
)


class BackendPlans:
    """Mixed into the codemod: plans `self._edits` for hard-coded NCCL backends."""

    def _plan_backend(self, call: cst.Call) -> None:
        literal = self._nccl_argument(call)
        if literal is not None:
            self._replace_nccl(literal)

    def _plan_backend_assignments(self) -> None:
        for target, statement in self.facts.assignments:
            if "backend" in last_name(target).lower() and _is_nccl(statement.value):
                self._replace_nccl(statement.value)

    def _replace_nccl(self, literal: cst.BaseExpression) -> None:
        if not self._runtime_name_free(literal, "default_backend", DEFAULT_BACKEND):
            self.report(literal, "AM314", BACKEND_ADVICE + " (`default_backend` means something else here)")
        elif self.fix(literal, "AM314", "\"nccl\" -> `default_backend()`: nccl where the script computes on CUDA, gloo elsewhere"):
            self.add_import(BACKEND_MODULE, "default_backend")
            self._edits[literal] = lambda updated: cst.Call(func=cst.Name("default_backend"))

    def _nccl_argument(self, call: cst.Call) -> Optional[cst.BaseExpression]:
        """The "nccl" literal given as `init_process_group`'s backend, or as the
        default of a backend flag of argparse."""
        if self.is_call_to(call, INIT_PROCESS_GROUP):
            args = positional(call)
            arg = args[0] if args else keyword_arg(call, "backend")
        elif method_name(call) == "add_argument" and any(string_value(a.value) in BACKEND_FLAGS for a in positional(call)):
            arg = keyword_arg(call, "default")
        else:
            return None
        return arg.value if arg is not None and _is_nccl(arg.value) else None

    def _runtime_name_free(self, site: cst.CSTNode, name: str, qualified: str) -> bool:
        """May `name`, imported from the runtime at module level, be used at `site`?"""
        return all(
            b.kind == "import" and b.qualified == qualified for b in self.script.bindings_of(name, site)
        ) and all(b.kind == "import" and b.qualified == qualified for b in self.script.module_scope.bindings.get(name, ()))


def _is_nccl(node: cst.BaseExpression) -> bool:
    return (string_value(node) or "").lower() == "nccl"
