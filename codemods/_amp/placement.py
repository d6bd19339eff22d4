"""Whether a step computes on the device binding in reach, or on the CPU.

A script may bind a device and never use it (PyTorch's CIFAR-10 tutorial
prints `device = torch.device("cuda:0" if ... else "cpu")` and leaves
`net = Net()` and its batches on the CPU). Autocast keyed to that device
would autocast for CUDA around work that runs on the CPU: nothing of it
would be in 16 bits, and a float16 scaler would scale for a device that
computes nothing. The step is keyed to the CPU instead, where it runs.
"""

from __future__ import annotations

import libcst as cst

from .._base import walk
from ..script.uses import uses_of
from .plan import CPU, Ref

UNUSED_DEVICE = (
    "; on the CPU, where the model and the batches stay (the script binds a device but moves nothing to it):"
    " to compute on the GPU, move them with `.to(device)` and set the autocast's device_type to device.type"
)
# Calls that show a device without placing anything on it.
DISPLAYS = frozenset({"builtins.print", "builtins.str", "builtins.repr", "builtins.format"})


class Placement:
    """Mixed into the codemod."""

    def where_computed(self, ref: Ref) -> Ref:
        """`ref`, or the CPU when nothing is ever placed on it."""
        if ref.kind not in ("name", "attr"):
            return ref
        if ref.key not in self.unused_devices:
            self.unused_devices[ref.key] = self.models_built_here() and self.only_shown(ref) and not self.places_elsewhere(ref)
        return self.cpu_ref() if self.unused_devices[ref.key] else ref

    def cpu_ref(self) -> Ref:
        ref = Ref(CPU, CPU, self.script.module_scope, [])
        return self.devices.setdefault(ref.key, ref)

    def left_unused(self) -> bool:
        """A device binding of the script was found unused: its steps run on the CPU."""
        return any(self.unused_devices.values())

    def models_built_here(self) -> bool:
        """Every training step's models are built by the file (`net = Net()`),
        not received from code out of view, which may have moved them."""
        steps = self.script.training_steps
        return bool(steps) and all(
            step.models and all(m.origin.binding.kind == "assign" and isinstance(m.origin.value, cst.Call) for m in step.models)
            for step in steps
        )

    def only_shown(self, ref: Ref) -> bool:
        """Every read of the device prints it, formats it or compares it."""
        uses = uses_of(self.script)
        reads = uses.reads(ref.name, ref.home) if ref.kind == "name" else uses.self_attribute_reads(ref.home, ref.name)
        return all(self.is_shown(read) for read in reads)

    def is_shown(self, read: cst.CSTNode) -> bool:
        for ancestor in self.ancestors(read):
            if isinstance(ancestor, (cst.FormattedStringExpression, cst.Comparison)):
                return True
            if isinstance(ancestor, cst.Call):
                return self.is_call_to(ancestor, DISPLAYS) or any(n.startswith("logging.") for n in self.qualified_names(ancestor.func))
            if isinstance(ancestor, cst.BaseStatement):
                return False
        return False

    def places_elsewhere(self, ref: Ref) -> bool:
        """Anything of the file outside the device's own bindings and the
        imports places, names or asks for a device (`.to(...)`, `device=`,
        `.cuda()`, a "cuda" string)."""
        skipped = {node for line in ref.bindings for node in walk(line)}
        skipped |= {node for statement in self.script.index.imports for node in walk(statement)}
        return any(self.facts.places(node) for node in self.script.index.nodes if node not in skipped)
