"""NVIDIA apex's amp (`from apex import amp`, `import apex.amp`): deprecated
by NVIDIA in favour of torch.amp and gone from current apex releases, so the
import stops the script on a current install (and apex itself needs CUDA).
The migration onto torch.amp (`torch.autocast` and `GradScaler` in place of
`amp.initialize` and `amp.scale_loss`) changes the precision of the
arithmetic, which `modernize` never does: it is the `amp` word's (and
`accelerate`'s and `fabric`'s), so this is a finding that names it (AM227),
not reported where one of those words runs in the same plan."""

from __future__ import annotations

import libcst as cst

from .._device.apex import _aliases, _qualified

APEX_AMP = "apex.amp"
CODE = "AM227"
MIGRATING_WORDS = ("amp", "accelerate", "fabric")


class ApexAmpPlans:
    """The planning of AM227, a part of the `Modernize` codemod."""

    def _plan_apex_amp(self) -> None:
        for kind in (cst.Import, cst.ImportFrom):
            for statement in self.model.index.nodes_of(kind):
                if isinstance(statement, cst.ImportFrom) and statement.relative:
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
