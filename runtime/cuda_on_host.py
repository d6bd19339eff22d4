"""A CUDA-only script's placements mapped onto this machine's device, for the
original side of `accelmigrate verify` on a machine without CUDA.

Installed from outside, as the recorder's probes are: a torch function mode
sees every torch call the script makes (`torch.device("cuda")`, factories
given `device="cuda"`, `Tensor.cuda()`, `Tensor.to("cuda:0")`, and
`Module.cuda()` and `Module.to()`, which move each parameter through those)
and puts the CUDA device it names onto the machine's device; `Tensor.type("torch.cuda.FloatTensor")` becomes
the host type, and `torch.load` loads onto the machine's device (a
checkpoint saved on a GPU). `torch.cuda.set_device` and
`torch.cuda.synchronize` do nothing. `torch.cuda.is_available()` still says
False: a script that asks takes its own branch for a machine without CUDA,
as its migrated copy does on the same machine.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(value: Any) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, str) and (value == "cuda" or value.startswith("cuda:"))


def _is_cuda_type(value: Any) -> bool:
    """`"torch.cuda.FloatTensor"`, or the legacy class itself."""
    if isinstance(value, str):
        return value.startswith("torch.cuda.")
    return isinstance(value, type) and getattr(value, "__module__", "") == "torch.cuda"


class CudaOnHost(TorchFunctionMode):
    """Every CUDA device a torch call names becomes `target`; `mapped`
    counts the calls changed."""

    def __init__(self, target: torch.device) -> None:
        super().__init__()
        self.target = target
        self.mapped = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            self.mapped += 1
            kwargs.pop("device", None)
            return args[0].to(self.target, **kwargs)
        if func is torch.device and args and _is_cuda(args[0]):
            self.mapped += 1
            return self.target  # `torch.device("cuda", 0)`
        if func is torch.Tensor.pin_memory:
            return args[0]  # pinning needs an accelerator; a host tensor is what it leaves
        if func is torch.Tensor.type and len(args) > 1 and _is_cuda_type(args[1]):
            self.mapped += 1
            name = args[1] if isinstance(args[1], str) else f"torch.cuda.{args[1].__name__}"
            args = (args[0], name.replace("torch.cuda.", "torch.", 1), *args[2:])
        elif func is torch.Tensor.to and len(args) > 1 and type(args[1]) is int:
            args = (args[0], "cuda", *args[2:])  # `.to(0)`: GPU 0
        if any(_is_cuda(a) for a in args) or any(_is_cuda(v) for v in kwargs.values()):
            self.mapped += 1
            args = tuple(self.target if _is_cuda(a) else a for a in args)
            kwargs = {k: self.target if _is_cuda(v) else v for k, v in kwargs.items()}
        return func(*args, **kwargs)


def install(target: torch.device) -> CudaOnHost:
    """Map CUDA onto `target` in this process from now on (no CUDA here)."""
    mode = CudaOnHost(target)
    mode.__enter__()
    torch.cuda.set_device = lambda device: None
    torch.cuda.synchronize = lambda device=None: None
    load = torch.load

    def load_here(f, map_location=None, *args, **kwargs):
        # A checkpoint saved on a GPU, or loaded onto one: onto `target` instead.
        if map_location is None or _is_cuda(map_location):
            map_location = target
        return load(f, map_location, *args, **kwargs)

    torch.load = load_here
    return mode
