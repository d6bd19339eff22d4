"""Measure a training script from outside, for `accelmigrate profile`.

    python -m accelmigrate.runtime.profiling --steps N --out RESULT.json SCRIPT [ARGS...]

Runs SCRIPT unchanged, as `python SCRIPT ARGS` would, after installing probes
on torch's own classes, and stops it after N training steps:

- a step ends when the first optimizer that steps (the lead one: with two
  optimizers, as in a GAN, one iteration is still one step) finishes
  `step()`; a global optimizer post-hook sees every optimizer. After N steps
  the hook raises a private BaseException, which `except Exception` in the
  script does not swallow; `finally` blocks of the script still run.
- time inside `next()` of every DataLoader iterator is data waiting, charged
  to the DataLoader by the place in the code that built it;
- at every step end: host memory (resident set from /proc/self/statm after
  handing glibc's free memory back with `malloc_trim`, else the peak from
  `resource`), allocated device memory on CUDA, how many tensors that were
  backpropagated in earlier steps are still alive (losses kept as tensors,
  with their graphs), `torch.cuda.empty_cache()` calls, and on CUDA
  the host-device synchronisations (`torch.cuda.set_sync_debug_mode`) and the
  device utilisation where the driver library reports it.

The probes' own work at a step end is charged to no step (the next step
starts its clock after it), though memory handed back by `malloc_trim` is
faulted in again by the next step. The per-step numbers go to RESULT.json;
`accelmigrate profile` (which never imports torch) turns them into a verdict
and advice.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
import warnings
import weakref
from typing import Any, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader
from torch.utils.data import dataloader as _dataloader

from . import cuda_on_host
from .device import chosen_device
from .script_runner import StopScript, run_script

_TORCH_DIR = os.path.dirname(torch.__file__)
_SYNC_WARNING = "called a synchronizing CUDA operation"
_KEY = "_accelmigrate_profile_key"


class Recorder:
    """Per-step measurements of the script running in this process."""

    def __init__(self, script: str, steps: int) -> None:
        self.script = script
        self.steps_wanted = steps
        self.steps: list[dict[str, Any]] = []
        self.loaders: dict[str, dict[str, Any]] = {}
        self.autocast_used = False
        self.optimizers_seen = 0
        self.device: Optional[str] = None
        self.low_precision_params = False
        self._lead: Optional[weakref.ref] = None
        self._seen_optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._backward_roots: list[tuple[int, weakref.ref]] = []
        self._reset_step_counters()
        self._step_started = time.perf_counter()

    def _reset_step_counters(self) -> None:
        self._data_wait: dict[str, float] = {}
        self._syncs = 0
        self._empty_cache_calls = 0

    # --- probes ---------------------------------------------------------------

    def install(self) -> None:
        self._probe_dataloaders()
        self._probe_optimizers()
        self._probe_backward()
        self._probe_autocast()
        self._probe_empty_cache()
        self._probe_syncs()

    def _probe_dataloaders(self) -> None:
        recorder = self
        original_init, original_iter = DataLoader.__init__, DataLoader.__iter__
        original_next = _dataloader._BaseDataLoaderIter.__next__

        def __init__(loader, *args, **kwargs):
            original_init(loader, *args, **kwargs)
            key = recorder._call_site()
            recorder.loaders.setdefault(key, _loader_settings(loader))
            object.__setattr__(loader, _KEY, key)

        def __iter__(loader):
            iterator = original_iter(loader)
            try:
                setattr(iterator, _KEY, getattr(loader, _KEY, "DataLoader"))
            except AttributeError:
                pass
            return iterator

        def __next__(iterator):
            started = time.perf_counter()
            try:
                return original_next(iterator)
            finally:
                key = getattr(iterator, _KEY, "DataLoader")
                recorder._data_wait[key] = recorder._data_wait.get(key, 0.0) + time.perf_counter() - started

        DataLoader.__init__, DataLoader.__iter__ = __init__, __iter__
        _dataloader._BaseDataLoaderIter.__next__ = __next__

    def _probe_optimizers(self) -> None:
        register_optimizer_step_post_hook(self._on_optimizer_step)

    def _probe_backward(self) -> None:
        recorder, original = self, torch.autograd.backward

        def backward(tensors, *args, **kwargs):
            roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
            for root in roots:
                recorder._backward_roots.append((len(recorder.steps), weakref.ref(root)))
            return original(tensors, *args, **kwargs)

        torch.autograd.backward = backward

    def _probe_autocast(self) -> None:
        recorder = self
        autocast = torch.amp.autocast_mode.autocast
        original = autocast.__enter__

        def __enter__(context):
            recorder.autocast_used = True
            return original(context)

        autocast.__enter__ = __enter__

    def _probe_empty_cache(self) -> None:
        recorder, original = self, torch.cuda.empty_cache

        def empty_cache():
            recorder._empty_cache_calls += 1
            return original()

        torch.cuda.empty_cache = empty_cache
        torch.cuda.memory.empty_cache = empty_cache

    def _probe_syncs(self) -> None:
        if not torch.cuda.is_available():
            return
        warnings.filterwarnings("always", message=_SYNC_WARNING)
        original_show = warnings.showwarning
        recorder = self

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if _SYNC_WARNING in str(message):
                recorder._syncs += 1
                return
            original_show(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        torch.cuda.set_sync_debug_mode("warn")

    # --- steps ----------------------------------------------------------------

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if optimizer not in self._seen_optimizers:
            self._seen_optimizers.add(optimizer)
            self.optimizers_seen += 1
        lead = self._lead() if self._lead is not None else None
        if lead is None:
            self._lead, lead = weakref.ref(optimizer), optimizer
            self._note_parameters(optimizer)
        if optimizer is not lead:
            return
        self._end_step()
        if len(self.steps) >= self.steps_wanted:
            raise StopScript()

    def _end_step(self) -> None:
        on_cuda = self.device is not None and self.device.startswith("cuda")
        if on_cuda:
            _synchronize_quietly()
        seconds = time.perf_counter() - self._step_started
        index = len(self.steps)
        self.steps.append(
            {
                "seconds": seconds,
                "data_wait": dict(self._data_wait),
                "host_rss_bytes": host_memory_bytes(),
                "device_allocated_bytes": torch.cuda.memory_allocated() if on_cuda else None,
                "syncs": self._syncs if torch.cuda.is_available() else None,
                "empty_cache_calls": self._empty_cache_calls,
                "kept_backward_roots": self._alive_roots_before(index),
                "utilization_percent": _utilization() if on_cuda else None,
            }
        )
        self._reset_step_counters()
        self._step_started = time.perf_counter()  # our own bookkeeping is charged to no step

    def _alive_roots_before(self, step: int) -> int:
        """Tensors backpropagated in earlier steps that something still holds."""
        self._backward_roots = [(s, ref) for s, ref in self._backward_roots if ref() is not None]
        return sum(1 for s, _ in self._backward_roots if s < step)

    def _note_parameters(self, optimizer) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if params:
            self.device = str(params[0].device)
            self.low_precision_params = any(p.dtype in (torch.float16, torch.bfloat16) for p in params)

    def _call_site(self) -> str:
        """`file.py:LINE` of the first caller outside torch and this module."""
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if not filename.startswith(_TORCH_DIR) and filename != __file__:
                return f"{_short_path(filename, self.script)}:{frame.f_lineno}"
            frame = frame.f_back
        return "DataLoader"

    def tail(self) -> dict[str, Any]:
        """What happened after the last step (all of the run when no optimizer stepped)."""
        return {"seconds": time.perf_counter() - self._step_started, "data_wait": dict(self._data_wait)}


def _loader_settings(loader) -> dict[str, Any]:
    return {
        "num_workers": loader.num_workers,
        "pin_memory": bool(loader.pin_memory),
        "persistent_workers": bool(loader.persistent_workers),
        "batch_size": loader.batch_size,
    }


def _short_path(filename: str, script: str) -> str:
    base = os.path.dirname(os.path.abspath(script))
    try:
        relative = os.path.relpath(filename, base)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative


def _load_malloc_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _load_malloc_trim()


def host_memory_bytes() -> int:
    """Resident memory of this process now (Linux), else its peak so far.

    glibc keeps freed memory mapped; handing it back first (`malloc_trim`)
    makes the resident size follow the memory still in use, so that a trend
    across steps is the script's and not the allocator's."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _synchronize_quietly() -> None:
    """Wait for the device so a step's time is its real time; not counted as the script's sync."""
    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(0)
    try:
        torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode(mode)


def _utilization() -> Optional[float]:
    try:
        return float(torch.cuda.utilization())
    except Exception:  # needs the driver's management library (pynvml); absent is fine
        return None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accelmigrate.runtime.profiling")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)

    faulthandler.enable()
    recorder = Recorder(options.script, options.steps)
    recorder.install()
    # Without CUDA, a CUDA-only script's placements run on this machine's
    # device (as `verify` runs an original), so that its loading and host
    # work can still be profiled; the report says so.
    cuda = None if torch.cuda.is_available() else cuda_on_host.install(chosen_device())
    status, exit_code, error = run_script(options.script, options.script_args)
    result = {
        "version": 1,
        "script": options.script,
        "args": options.script_args,
        "steps_requested": options.steps,
        "status": status,
        "exit_code": exit_code,
        "error": error,
        "device": recorder.device,
        "cuda_available": torch.cuda.is_available(),
        "cuda_mapped_to": str(cuda.target) if cuda is not None and cuda.mapped else None,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "syncs_measurable": torch.cuda.is_available(),
        "autocast_used": recorder.autocast_used,
        "low_precision_params": recorder.low_precision_params,
        "optimizers_seen": recorder.optimizers_seen,
        "loaders": recorder.loaders,
        "steps": recorder.steps,
        "tail": recorder.tail(),
    }
    with open(options.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    sys.stdout.flush()
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
