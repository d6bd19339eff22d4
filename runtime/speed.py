"""Run-time gates for the speed codemods (compile, tf32, channels-last, fused-optim).

Each rewrite those codemods make asks one of these functions first, so that
the same migrated file runs on a GPU, where the rewrite pays, and on a CPU,
where it would only change the numbers or cost compile time:

- `should_compile(model)`: `torch.compile` when the model's parameters are on
  CUDA (and triton is there to generate kernels);
- `use_tf32_matmul()`: float32 matmuls on CUDA in TF32 (cuDNN convolutions
  already are by default); it touches no CPU setting;
- `to_channels_last(value)`: a module on CUDA, or a 4-D CUDA tensor, in the
  channels-last memory format; anything else unchanged;
- `fused_on_cuda(*modules)`: True when every parameter of the modules is a
  floating-point CUDA tensor, where the fused optimizer kernels run.

Environment switches, for a side-by-side comparison or a CPU test:
ACCELMIGRATE_COMPILE, ACCELMIGRATE_TF32, ACCELMIGRATE_CHANNELS_LAST and
ACCELMIGRATE_FUSED set to 0 turn a rewrite off everywhere; set to 1 they turn
compile and channels-last on for CPU modules and tensors too (fused stays
CUDA-only: the CPU kernels round differently from the default ones).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Optional, TypeVar

import torch

COMPILE_VARIABLE = "ACCELMIGRATE_COMPILE"
TF32_VARIABLE = "ACCELMIGRATE_TF32"
CHANNELS_LAST_VARIABLE = "ACCELMIGRATE_CHANNELS_LAST"
FUSED_VARIABLE = "ACCELMIGRATE_FUSED"

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")

Value = TypeVar("Value")


def switch(variable: str) -> Optional[bool]:
    """True or False when `variable` forces a rewrite on or off; None when unset."""
    value = os.environ.get(variable, "").strip().lower()
    if not value:
        return None
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{variable}={value!r}: expected 1 or 0")


def on_cuda(module: torch.nn.Module) -> bool:
    """The module has parameters, and the first is on a CUDA device."""
    first = next(module.parameters(), None)
    return first is not None and first.device.type == "cuda"


def should_compile(model: torch.nn.Module) -> bool:
    """Compile when the model computes on a GPU that triton generates kernels
    for (compute capability 7.0 on); on a CPU the first steps would pay the
    compile time and a short run would never win it back."""
    forced = switch(COMPILE_VARIABLE)
    if forced is not None:
        return forced
    if not on_cuda(model) or importlib.util.find_spec("triton") is None:
        return False
    device = next(model.parameters()).device
    return torch.cuda.get_device_capability(device) >= (7, 0)


def use_tf32_matmul() -> None:
    """float32 matrix products on CUDA in TF32 (10-bit mantissa inputs, float32
    accumulation): Ampere and later GPUs run them several times faster. The
    backend-specific setting of torch 2.9 on (the legacy one elsewhere) leaves
    CPU matmuls alone, so a CPU run keeps its numbers."""
    if switch(TF32_VARIABLE) is False:
        return
    matmul = torch.backends.cuda.matmul
    if _has_fp32_precision(matmul):
        matmul.fp32_precision = "tf32"
    else:
        matmul.allow_tf32 = True


def _has_fp32_precision(matmul) -> bool:
    try:
        matmul.fp32_precision
    except AttributeError:
        return False
    return True


def to_channels_last(value: Value) -> Value:
    """A module on CUDA (converted in place, and returned) or a 4-D CUDA tensor
    (a channels-last copy) in the channels-last memory format, which cuDNN's
    convolution kernels read without transposing; anything else as it is."""
    forced = switch(CHANNELS_LAST_VARIABLE)
    if forced is False:
        return value
    if isinstance(value, torch.nn.Module):
        if forced or on_cuda(value):
            return value.to(memory_format=torch.channels_last)
        return value
    if isinstance(value, torch.Tensor) and value.dim() == 4 and (forced or value.device.type == "cuda"):
        return value.contiguous(memory_format=torch.channels_last)
    return value


def fused_on_cuda(*modules: torch.nn.Module) -> bool:
    """`fused=` for Adam, AdamW and SGD: True when every parameter of these
    modules is a floating-point CUDA tensor (one kernel launch updates them
    all); False on a CPU, where the script keeps the default implementation
    and its numbers."""
    if switch(FUSED_VARIABLE) is False:
        return False
    parameters = [p for module in modules for p in module.parameters()]
    return bool(parameters) and all(p.device.type == "cuda" and p.is_floating_point() for p in parameters)


__all__ = [
    "CHANNELS_LAST_VARIABLE",
    "COMPILE_VARIABLE",
    "FUSED_VARIABLE",
    "TF32_VARIABLE",
    "fused_on_cuda",
    "on_cuda",
    "should_compile",
    "switch",
    "to_channels_last",
    "use_tf32_matmul",
]
