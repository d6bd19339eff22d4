"""What the script model shows about values: one number, a loss, no gradient."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ..script import ScriptModel
from ..script.scopes import Binding
from .gradients import Gradients
from .loss_arguments import Losses
from .one_number import OneNumber
from .shapes import Shapes
from .syntax import Expression


class Values(OneNumber, Losses, Gradients, Shapes):
    """What the script model shows about values: whether an expression holds
    one number, whether it can carry a gradient, and which running totals
    add up `.data` values."""

    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        self._levels: dict[tuple, Optional[str]] = {}
        self._in_progress: set[tuple] = set()
        self._grad_free: dict[tuple, bool] = {}
        self._global_names = {name for scope in model.scopes for name in scope.declared_global}

    def _is_module_function(self, call: cst.Call) -> bool:
        """`torch.sum(...)`, `np.mean(...)`: a function of an imported module, not a method."""
        root = call.func
        while isinstance(root, cst.Attribute):
            root = root.value
        return isinstance(root, cst.Name) and any(b.kind == "import" for b in self.model.bindings_of(root.value, root))

    def _arguments(self, parameter: Binding) -> Optional[list[Expression]]:
        """What the file's calls pass for a parameter (its default where a call
        passes nothing); None when a call cannot be read or there is none."""
        function = self.model.flow.functions.get(parameter.scope.node)
        sites = function.callers if function is not None else []
        if not sites:
            return None
        found = []
        for site in sites:
            argument = site.arguments.get(parameter.name, parameter.value)
            if argument is None or not site.complete:
                return None
            found.append(argument)
        return found
