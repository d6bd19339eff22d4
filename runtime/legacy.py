"""Legacy tensor types (`torch.FloatTensor`, `torch.cuda.FloatTensor`) on
the runtime's device.

Older scripts choose their constructor once, `Tensor = torch.cuda.FloatTensor
if cuda else torch.FloatTensor`, and create every tensor with `Tensor(...)`.
`tensor_type(torch.float32, device)` is that choice made by the device
instead of by CUDA's presence: the very CPU or CUDA type where the device is
the CPU or the current GPU, so `Tensor(...)` and `x.type(Tensor)` behave as
before there, and elsewhere (Apple's `mps`, another GPU) a constructor that
builds on the CPU and moves the result to the device.
"""

from __future__ import annotations

from typing import Callable, Union

import torch

_NAMES = {
    torch.float32: "FloatTensor",
    torch.float64: "DoubleTensor",
    torch.float16: "HalfTensor",
    torch.bfloat16: "BFloat16Tensor",
    torch.uint8: "ByteTensor",
    torch.int8: "CharTensor",
    torch.int16: "ShortTensor",
    torch.int32: "IntTensor",
    torch.int64: "LongTensor",
    torch.bool: "BoolTensor",
}


def tensor_type(dtype: torch.dtype, device: Union[str, torch.device]) -> Callable[..., torch.Tensor]:
    """The legacy constructor of `dtype` tensors on `device`."""
    device = torch.device(device)
    name = _NAMES[dtype]
    if device.type == "cpu":
        return getattr(torch, name)
    if device.type == "cuda" and (device.index is None or device.index == torch.cuda.current_device()):
        return getattr(torch.cuda, name)
    return _OnDevice(getattr(torch, name), device)


class _OnDevice:
    """`cpu_type(...)` built on the CPU, then moved to `device`."""

    def __init__(self, cpu_type: type, device: torch.device) -> None:
        self.cpu_type = cpu_type
        self.device = device

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        return self.cpu_type(*args, **kwargs).to(self.device)

    def __repr__(self) -> str:
        return f"tensor_type({self.cpu_type.__name__}, {self.device})"
