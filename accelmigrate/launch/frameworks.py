"""What `accelerate launch` and `fabric run` tell the processes they start,
told by `accelmigrate run` and `verify` as well: a script migrated to a
default `Accelerator()` or `Fabric()` reads its processes, devices and
nodes from these variables, as those launchers set them, and under a bare
torchrun without them each process would train alone."""

from __future__ import annotations

from typing import MutableMapping


def tell_frameworks(environ: MutableMapping[str, str], processes_per_node: int, nodes: int, cuda: bool) -> None:
    """Set (where the user has not) Accelerate's and Lightning Fabric's launch variables in `environ`."""
    if not cuda:
        # Accelerate joins torchrun's processes into one gloo group only when told to use the CPU.
        environ.setdefault("ACCELERATE_USE_CPU", "true")
    # Fabric() reads `fabric run --devices N --num-nodes M` from these.
    environ.setdefault("LT_DEVICES", str(processes_per_node))
    environ.setdefault("LT_NUM_NODES", str(nodes))
