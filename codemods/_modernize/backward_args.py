"""`loss.backward(retain_variables=True)` becomes
`loss.backward(retain_graph=True)` (AM226): the keyword's name since
PyTorch 0.4, a TypeError today."""

from __future__ import annotations

import libcst as cst

from .._base import keyword_arg
from .._item.syntax import first_line

OLD, NEW = "retain_variables", "retain_graph"


class BackwardArgumentPlans:
    """The planning of AM226, a part of the `Modernize` codemod."""

    def _plan_backward_arguments(self) -> None:
        for step in self.model.training_steps:
            call = step.backward
            old = keyword_arg(call, OLD)
            if old is None or not _is_tensor_backward(call):
                continue
            if keyword_arg(call, NEW) is not None:
                self.report(call, "AM226", f"{first_line(call)}: {OLD}= was removed in PyTorch 0.4 (a TypeError "
                            f"today) and {NEW}= is given too: keep the one meant and drop the other")
            elif self.fix(call, "AM226", f"{OLD}= was renamed {NEW}= in PyTorch 0.4 (a TypeError today)"):
                self._replace[old.keyword] = ("rename", NEW)


def _is_tensor_backward(call: cst.Call) -> bool:
    """`x.backward(...)` or `torch.autograd.backward(...)`, not `manual_backward`."""
    func = call.func
    return not isinstance(func, cst.Attribute) or func.attr.value == "backward"
