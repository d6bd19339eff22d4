"""The module side of a training loop that scripts of the project hand
their set-up model, optimizer and training DataLoader, in Fabric's calls:
the accelerate reading of such a loop (codemods/_accelerate/received.py)
with Fabric's spellings (`fabric.backward`, `fabric.print`, `fabric.all_reduce`;
the function takes `fabric`, which the scripts pass).

Gradient clipping in the loop is refused: `fabric.clip_gradients` takes the
model with the one optimizer made from its parameters, which the module
cannot see.
"""

from __future__ import annotations

from .._accelerate.received import ReceivedPlanner
from .common import FABRIC
from .plan import FabricPlanner


class ReceivedFabricPlanner(ReceivedPlanner, FabricPlanner):
    """Plans the loop function the scripts hand what they set up, as the entry point they pass the Fabric object from."""

    setups: dict = {}  # no model's optimizers are known here: a clip is refused (FabricPlanner._clipped)
    passed = FABRIC

    def make(self):
        plan = ReceivedPlanner.make(self)
        self._refuse_untranslated(plan)
        return plan


__all__ = ["ReceivedFabricPlanner"]
