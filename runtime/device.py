"""The one device this process computes on.

`get_device()`: `cuda:<local rank>` when CUDA is available, else `mps` on
Apple silicon, else `cpu`. ACCELMIGRATE_DEVICE overrides it (e.g. `cpu`).

When the device is a GPU it also becomes the current CUDA device, as
`torch.cuda.set_device(local_rank)` would make it: code that still says
plain "cuda" (NCCL, `torch.cuda.current_device()`, a library's default)
lands on the same GPU as everything placed with `.to(device)`. That is why
the `device` codemod can remove the script's own `torch.cuda.set_device`.
"""

from __future__ import annotations

import os

import torch

from . import env


def get_device() -> torch.device:
    forced = os.environ.get("ACCELMIGRATE_DEVICE", "").strip()
    if forced:
        device = torch.device(forced)
    elif torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank() % max(1, torch.cuda.device_count()))
    elif _mps_available():
        device = torch.device("mps")
    else:
        device = torch.device("cpu")
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    return device


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()
