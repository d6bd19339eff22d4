"""NVIDIA apex's amp (`from apex import amp`, `import apex.amp`): deprecated
by NVIDIA in favour of torch.amp and gone from current apex releases, so the
import stops the script on a current install (and apex itself needs CUDA).
The migration onto torch.amp (`torch.autocast` and `GradScaler` in place of
`amp.initialize` and `amp.scale_loss`) changes the precision of the
arithmetic, which `modernize` never does: it is the `amp` word's (and
`accelerate`'s and `fabric`'s), so this is a finding that names it (AM227),
not reported where one of those words runs in the same plan. An import under
`try:` whose handler takes the ImportError without raising does not stop
the script (it runs without apex): no finding."""

from __future__ import annotations

import libcst as cst

from .._device.apex import IMPORT_ERRORS, _aliases, _qualified, _raises

APEX_AMP = "apex.amp"
CODE = "AM227"
MIGRATING_WORDS = ("amp", "accelerate", "fabric")
CAUGHT_BY = IMPORT_ERRORS | {"builtins.Exception", "builtins.BaseException"}


class ApexAmpPlans:
    """The planning of AM227, a part of the `Modernize` codemod."""

    def _plan_apex_amp(self) -> None:
        for kind in (cst.Import, cst.ImportFrom):
            for statement in self.model.index.nodes_of(kind):
                if isinstance(statement, cst.ImportFrom) and statement.relative or self._guarded(statement):
                    continue
                for alias in _aliases(statement):
                    name = _qualified(statement, alias)
                    if name == APEX_AMP or name.startswith(APEX_AMP + "."):
                        self.report(
                            alias if alias is not None else statement, CODE,
                            f"`{name}`: NVIDIA apex's amp is deprecated and gone from current apex releases (an "
                            "ImportError there; apex also needs CUDA): `accelmigrate apply --to amp` moves it onto "
                            "torch.amp (torch.autocast and a GradScaler), or `--to accelerate`/`--to fabric` onto "
                            "their mixed precision",
                        )

    def _guarded(self, statement: cst.CSTNode) -> bool:
        """In the body of a `try:` whose handler takes an ImportError and goes on."""
        child = statement
        for ancestor in self.ancestors(statement):
            if isinstance(ancestor, cst.Try) and child is ancestor.body and any(
                self._takes_import_error(handler) and not _raises(handler) for handler in ancestor.handlers
            ):
                return True
            child = ancestor
        return False

    def _takes_import_error(self, handler: cst.ExceptHandler) -> bool:
        caught = handler.type
        if caught is None:
            return True
        names = [e.value for e in caught.elements] if isinstance(caught, cst.Tuple) else [caught]
        return any(self.is_qualified(name, CAUGHT_BY) for name in names)
