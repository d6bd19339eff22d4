"""The one device this process computes on.

`get_device()`: `cuda:<local rank>` when CUDA is available, else `mps` on
Apple silicon, else `cpu`. ACCELMIGRATE_DEVICE overrides it (e.g. `cpu`).

When the device is a GPU it also becomes the current CUDA device, as
`torch.cuda.set_device(local_rank)` would make it: code that still says
plain "cuda" (NCCL, `torch.cuda.current_device()`, a library's default)
lands on the same GPU as everything placed with `.to(device)`.
`chosen_device()` answers the same choice without making it current.

`device_at(index)` is what `.cuda(index)` means where CUDA is available
(GPU `index`, or the current GPU for None), and the runtime's device
elsewhere: a script that computes the GPU of each process (`mp.spawn`
workers' `.cuda(rank)`) keeps its GPUs and runs on a CPU.

`device_ids_for(device)` is DistributedDataParallel's `device_ids` for a
module just moved to `device`: its GPU, or None off CUDA (where DDP refuses
GPU ids).
"""

from __future__ import annotations

import os
from typing import Optional, Union

import torch

from . import env


def get_device() -> torch.device:
    device = chosen_device()
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    return device


def chosen_device() -> torch.device:
    """The device `get_device()` returns, with no side effect."""
    forced = os.environ.get("ACCELMIGRATE_DEVICE", "").strip()
    if forced:
        return torch.device(forced)
    if torch.cuda.is_available():
        return torch.device("cuda", env.local_rank() % max(1, torch.cuda.device_count()))
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def device_at(index: Optional[Union[int, str, torch.device]] = None) -> torch.device:
    """GPU `index` (the current GPU when None, as `.cuda()` means) with CUDA;
    otherwise the device `get_device()` chooses."""
    chosen = chosen_device()
    if chosen.type != "cuda":
        return chosen
    if index is None:
        return torch.device("cuda")
    if isinstance(index, int):
        return torch.device("cuda", index)
    return torch.device(index)


def device_ids_for(device: torch.device) -> Optional[list[int]]:
    """`device_ids` of a module placed on `device`: [its GPU] on CUDA (the
    current GPU when no index is given), None elsewhere."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return [device.index if device.index is not None else torch.cuda.current_device()]


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()
