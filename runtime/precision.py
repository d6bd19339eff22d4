"""The 16-bit type that autocast computes in, and the matching gradient scaler.

`autocast_dtype(device)`: bfloat16 on GPUs that compute it natively (CUDA
from Ampere on, XPU), float16 on older CUDA GPUs and on MPS, and float32 (no
mixed precision) on the CPU. ACCELMIGRATE_PRECISION=bf16|fp16|fp32 overrides
the choice; fp32 means "no mixed precision" and migrated code then passes
`enabled=False` to autocast.

Why float32 on the CPU: CPU autocast keeps far fewer operations in float32
than CUDA's (softmax, log_softmax, sum, cumsum, layer_norm, group_norm, exp,
log and pow all run in bfloat16 there), bfloat16 is slower than float32 on
CPUs without bfloat16 units, and a migrated script run on a CPU is expected
to reproduce the original's numbers. ACCELMIGRATE_PRECISION=bf16 opts in.

`grad_scaler(device, dtype, **options)`: a `torch.amp.GradScaler` that is
enabled only for float16, whose narrow exponent range needs loss scaling;
with bfloat16 or float32 it is a no-op and the same training code runs
unchanged. `options` are GradScaler's own (init_scale, growth_interval, ...);
`enabled=False` keeps it off in every precision.

`scaler_for(optimizer, device, dtype, **options)`: the one scaler of
`optimizer`, made by `grad_scaler` at its first call: for a training
function that receives an optimizer built elsewhere (another module, a
factory), so that the loss scale carries over from one call (one epoch) to
the next, as with a scaler bound next to the optimizer.
`full_precision(value)`: a float16 or bfloat16 tensor as float32 (lists and
tuples of them element by element), anything else unchanged. Values computed
under autocast pass through it where they leave for numpy, which has no
bfloat16 (`tensor.numpy()` raises "Got unsupported ScalarType BFloat16").
"""

from __future__ import annotations

import os
import weakref
from typing import Union

import torch

PRECISION_VARIABLE = "ACCELMIGRATE_PRECISION"

_BY_NAME = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}

DeviceLike = Union[torch.device, str]


def forced_dtype() -> Union[torch.dtype, None]:
    """The dtype ACCELMIGRATE_PRECISION asks for, or None when it is unset."""
    value = os.environ.get(PRECISION_VARIABLE, "").strip().lower()
    if not value:
        return None
    if value not in _BY_NAME:
        raise ValueError(f"{PRECISION_VARIABLE}={value!r}: expected one of bf16, fp16, fp32")
    return _BY_NAME[value]


def autocast_dtype(device: DeviceLike) -> torch.dtype:
    """The dtype for `torch.autocast(device_type=device.type, dtype=...)`."""
    forced = forced_dtype()
    if forced is not None:
        return forced
    kind = torch.device(device).type
    if kind == "cpu":
        return torch.float32
    if kind == "cuda":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float16
    if kind == "mps":
        return torch.float16
    return torch.bfloat16


def grad_scaler(device: DeviceLike, dtype: torch.dtype, enabled: bool = True, **options) -> torch.amp.GradScaler:
    """A GradScaler that scales only float16 losses (a no-op otherwise)."""
    return torch.amp.GradScaler(torch.device(device).type, enabled=bool(enabled) and dtype == torch.float16, **options)


# One scaler per optimizer, dropped with it.
_SCALERS: "weakref.WeakKeyDictionary[torch.optim.Optimizer, torch.amp.GradScaler]" = weakref.WeakKeyDictionary()


def scaler_for(optimizer, device: DeviceLike, dtype: torch.dtype, enabled: bool = True, **options) -> torch.amp.GradScaler:
    """`optimizer`'s GradScaler: made at the first call, the same one after.
    For None (a function called without its optimizer) a scaler that scales
    nothing: a backward run there computes what it computed before."""
    if optimizer is None:
        return grad_scaler(device, dtype, enabled=False)
    scaler = _SCALERS.get(optimizer)
    if scaler is None:
        scaler = _SCALERS[optimizer] = grad_scaler(device, dtype, enabled, **options)
    return scaler


_REDUCED = (torch.float16, torch.bfloat16)


def full_precision(value):
    """`value` with its float16/bfloat16 tensors cast to float32."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in _REDUCED else value
    if type(value) in (list, tuple):
        return type(value)(full_precision(v) for v in value)
    return value


__all__ = ["PRECISION_VARIABLE", "autocast_dtype", "forced_dtype", "full_precision", "grad_scaler", "scaler_for"]
