"""The process-group backend for the device this process computes on.

`default_backend()`: "nccl" when the runtime's device is a GPU, else "gloo",
the same choice as `init_distributed()`. A script that names "nccl" itself
cannot start its process group on a CPU; with this it can, and on GPUs it
still gets NCCL. Choosing changes nothing: the current CUDA device stays
what the script made it (an `mp.spawn` worker's `set_device(rank)`).
"""

from __future__ import annotations

from .device import chosen_device


def default_backend() -> str:
    return "nccl" if chosen_device().type == "cuda" else "gloo"
