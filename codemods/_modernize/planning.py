"""What the parts of `modernize` share: the rewrites planned so far, and how
`torch` is spelled where code is added. The codemod and its parts import
this module, never each other."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._base import Codemod


class Planning(Codemod):
    """The planned rewrites of `modernize`, read by its parts while they plan
    and by the codemod while it rewrites."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._replace: dict[cst.CSTNode, object] = {}  # original node -> how to rewrite it
        self._doomed: set[cst.CSTNode] = set()  # statement lines left doing nothing
        self._wraps: dict[cst.CSTNode, list] = {}  # block -> [(first, last) statement under no_grad]
        self._torch: Optional[str] = "torch"

    def _statement_line(self, node: cst.CSTNode) -> Optional[cst.SimpleStatementLine]:
        """The simple statement line holding `node`, None inside a compound statement's header."""
        for ancestor in self.model.ancestors(node):
            if isinstance(ancestor, cst.SimpleStatementLine):
                return ancestor
            if isinstance(ancestor, cst.BaseCompoundStatement):
                return None
        return None

    # spelling `torch` where code is added ------------------------------------------

    def _torch_spelling(self) -> Optional[str]:
        """The module-level name that imports torch, else "torch" when nothing
        binds that name (an import is added), else None."""
        for binding in self.model.imports:
            if binding.qualified == "torch" and binding.scope.kind == "module":
                return binding.name
        return "torch" if "torch" not in self.model.module_scope.bindings else None

    def _need_torch(self, at: cst.CSTNode) -> None:
        if self.model.index.names_of(self._torch, self.model.scope_of(at)) != frozenset({"torch"}):
            self.add_import("torch")

    def torch_reads_torch(self, at: cst.CSTNode) -> bool:
        """`torch` (as spelled) at `at` reads the module, or nothing yet."""
        if self._torch is None:
            return False
        names = self.model.index.names_of(self._torch, self.model.scope_of(at))
        return names in (frozenset({"torch"}), frozenset())
