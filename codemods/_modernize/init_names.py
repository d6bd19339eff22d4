"""`nn.init.xavier_uniform(w)` and the other initialisers without the
trailing underscore become their current names (AM225)."""

from __future__ import annotations

import libcst as cst

from .._base import dotted_name
from ..script.vocabulary import DEPRECATED_INIT
from .syntax import in_import

INIT_MODULES = ("torch.nn.init",)


class InitNamePlans:
    """The planning of AM225, a part of the `Modernize` codemod."""

    def _plan_initialisers(self) -> None:
        for node in self.model.index.nodes_of(cst.ImportFrom, cst.Attribute, cst.Name):
            if isinstance(node, cst.ImportFrom) and dotted_name(node.module or cst.Name("_")) in INIT_MODULES:
                if not isinstance(node.names, cst.ImportStar):
                    for alias in node.names:
                        if isinstance(alias.name, cst.Name) and alias.name.value in DEPRECATED_INIT:
                            self._rename(alias.name, alias.name.value)
            elif isinstance(node, (cst.Attribute, cst.Name)) and not in_import(self.model, node):
                name = node.attr.value if isinstance(node, cst.Attribute) else node.value
                if name in DEPRECATED_INIT and self.model.qualified_names(node) == {f"torch.nn.init.{name}"}:
                    if isinstance(node, cst.Name) and isinstance(self.model.parent(node), cst.Attribute):
                        continue  # the attribute of `init.normal`: the Attribute is handled
                    self._rename(node, name)

    def _rename(self, node: cst.CSTNode, name: str) -> None:
        if self.fix(node, "AM225", f"torch.nn.init.{name} is a deprecated alias: torch.nn.init.{name}_"):
            self._replace[node] = ("rename", f"{name}_")
