"""Batch-size helpers for migrated scripts.

`find_max_batch_size(trial, start)`: the largest batch size whose training
step fits in device memory, agreed on by every rank of a process group.

`no_sync_unless(sync, *models)`: the context that gradient accumulation runs
a micro-batch's forward and backward in: `model.no_sync()` (no gradient
all-reduce) for a model wrapped in DistributedDataParallel (or anything else
with a `no_sync()`, e.g. FSDP) unless `sync` is true; nothing at all for a
model that is not wrapped (a plain `python train.py` run).

Imports torch and the standard library only.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Callable, Iterator

import torch


@contextlib.contextmanager
def no_sync_unless(sync: bool, *models: torch.nn.Module) -> Iterator[None]:
    """`with no_sync_unless(end_of_group, model):` around the forward and the
    backward of a micro-batch: gradients are all-reduced only when `sync`."""
    with contextlib.ExitStack() as stack:
        if not sync:
            for model in models:
                no_sync = getattr(model, "no_sync", None)  # DistributedDataParallel
                if callable(no_sync):
                    stack.enter_context(no_sync())
                elif callable(getattr(model, "set_requires_gradient_sync", None)):  # FSDP2's sharded modules
                    stack.enter_context(_gradient_sync_off(model))
        yield


@contextlib.contextmanager
def _gradient_sync_off(model: torch.nn.Module) -> Iterator[None]:
    """FSDP2 keeps the unsharded gradients and skips their reduce-scatter
    until a micro-batch that syncs again."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def is_out_of_memory(error: BaseException) -> bool:
    """The device ran out of memory (CUDA's `OutOfMemoryError`, or the plain
    RuntimeError that other backends and older releases raise)."""
    kinds = tuple(k for k in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if k)
    if kinds and isinstance(error, kinds):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def find_max_batch_size(trial: Callable[[int], object], start: int = 1024, *, minimum: int = 1) -> int:
    """The largest batch size, at most `start`, for which `trial(batch_size)`
    runs without running out of device memory.

    `trial` runs one representative step at that batch size (forward,
    backward and optimizer step on synthetic or real data) and returns
    nothing useful; an out-of-memory error means "does not fit", any other
    error propagates. The search halves `start` until a size fits, then
    binary-searches between that size and the smallest failure above it:
    log2(start) + 1 trials at most when `start` is a power of two. It assumes
    that a size fits when a larger one does.

    Under a process group every rank must call it with the same `start`; each
    trial's outcome is agreed with an all-reduce (MIN), so all ranks take the
    same path and return the same size: the largest that fits on every rank.
    A trial should not communicate itself (run it on the model inside
    `model.no_sync()`, or on the unwrapped module), or a rank that runs out
    of memory would leave the others waiting in a collective.

    Raises RuntimeError when even `minimum` does not fit.

    Example::

        def trial(batch_size):
            x = torch.randn(batch_size, 3, 224, 224, device=device)
            model(x).sum().backward()
            model.zero_grad(set_to_none=True)

        batch_size = find_max_batch_size(trial, start=512)
    """
    if start < minimum or minimum < 1:
        raise ValueError(f"need 1 <= minimum <= start (got minimum={minimum}, start={start})")
    size, too_big = start, None
    while not _fits_everywhere(trial, size):
        too_big, size = size, size // 2
        if size < minimum:
            raise RuntimeError(f"even a batch of {too_big} runs out of device memory (tried down to minimum={minimum})")
    if too_big is not None:
        size = _largest_fitting(trial, size, too_big)
    return _agreed_minimum(size)


def _largest_fitting(trial: Callable[[int], object], fits: int, too_big: int) -> int:
    """Binary search in (fits, too_big): `fits` fits, `too_big` does not."""
    while too_big - fits > 1:
        middle = (fits + too_big) // 2
        if _fits_everywhere(trial, middle):
            fits = middle
        else:
            too_big = middle
    return fits


def _fits_everywhere(trial: Callable[[int], object], batch_size: int) -> bool:
    return bool(_agreed_minimum(int(_fits(trial, batch_size))))


def _fits(trial: Callable[[int], object], batch_size: int) -> bool:
    try:
        trial(batch_size)
        return True
    except Exception as error:  # only out-of-memory means "does not fit"
        if not is_out_of_memory(error):
            raise
    # Out of the except block the exception, and the frames that hold the
    # failed trial's tensors, are gone: their memory can be released.
    gc.collect()
    _release_cached_memory()
    return False


def _release_cached_memory() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    mps = getattr(torch, "mps", None)
    if mps is not None and torch.backends.mps.is_available():
        mps.empty_cache()


def _agreed_minimum(value: int) -> int:
    """The minimum of `value` over the ranks of the process group (the value
    itself without one)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


__all__ = ["find_max_batch_size", "is_out_of_memory", "no_sync_unless"]
