"""Why a wrapped model needs `find_unused_parameters=True`: a step that leaves
some of its parameters without gradients makes DDP fail the next step
("Expected to have finished reduction in the prior iteration"). Two shapes
this file shows: a layer its `forward` calls only under a condition, and a
`forward` that returns several outputs (an InfoGAN discriminator's
validity, class and code heads) of which a training call uses only some
(`validity, _, _ = netD(fake)`, `netD(x)[0]`): the heads behind the others
get no gradient from that loss. The second is judged conservatively: an
output left unused at one training call is enough.
"""

from __future__ import annotations

import libcst as cst

from .._base import walk
from .common import Var
from .queries import ScriptQueries, method_of

OUTPUTS_NOTE = (
    "; `find_unused_parameters=True`: its `forward` returns several outputs and a training step uses only some of "
    "them, so the layers behind the others may get no gradient"
)


class UnusedParameters(ScriptQueries):
    """Finds the models whose training steps may leave parameters unused."""

    def _outputs_left_unused(self, model: Var) -> bool:
        klass = self._model_class(model)
        forward = method_of(klass, "forward") if klass is not None else None
        if forward is None or not self._returns_several(forward):
            return False
        for reference, _ in self._followed_references(model):
            call = self.parent(reference)
            if isinstance(call, cst.Call) and call.func is reference and not self.script.in_evaluation(call):
                if self._drops_an_output(call):
                    return True
        return False

    def _returns_several(self, forward: cst.FunctionDef) -> bool:
        returns = [r for r in walk(forward.body) if isinstance(r, cst.Return) and r.value is not None]
        return bool(returns) and all(isinstance(r.value, (cst.Tuple, cst.List)) and len(r.value.elements) > 1 for r in returns)

    def _drops_an_output(self, call: cst.Call) -> bool:
        """`call(...)[i]`, or `a, _, _ = call(...)` with an element never read."""
        parent = self.parent(call)
        if isinstance(parent, cst.Subscript) and parent.value is call:
            return True
        if not (isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1):
            return False
        target = parent.targets[0].target
        if not isinstance(target, (cst.Tuple, cst.List)):
            return False
        for element in target.elements:
            var = self._target_var(element.value) if isinstance(element.value, cst.Name) else None
            if var is None or not self._references(var):
                return True
        return False
