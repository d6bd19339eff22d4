"""Record a training script's losses and weights, for `accelmigrate verify`.

    ACCELMIGRATE_VERIFY_OUT=FOLDER ACCELMIGRATE_VERIFY_STEPS=K \\
        python -m accelmigrate.runtime.verifying SCRIPT [ARGS...]

Runs SCRIPT unchanged, as `python SCRIPT ARGS` would (also as the entry
module of each rank under torchrun), after seeding Python's, numpy's and
torch's generators with 0 and installing probes on torch's own classes:

- every `backward()` adds its root's value to the loss of the current step
  (the value before a GradScaler scaled it), so K accumulated micro-batches
  of `loss / K` add up to the mean loss of the big batch;
- every optimizer `step()` closes a step: its loss, and a checksum of that
  optimizer's parameters (their sum and sum of squares, in float64);
- `torch.autocast` regions entered with a 16-bit dtype are noted, so that
  `verify` knows which tolerance applies;
- with ACCELMIGRATE_VERIFY_BATCH_SCALE=N every DataLoader given a
  `batch_size` yields N times larger batches: the big-batch reference for a
  migration to gradient accumulation or to N processes;
- the size of each batch a DataLoader yields is noted, and each step
  records the samples its backward passes were computed on (the last
  batch yielded before each): ranks that share a batch out unevenly;
- BatchNorm normalising a batch in training (`torch.nn.functional.batch_norm`,
  which the BatchNorm modules call) is noted: statistics that depend on
  how the batch is split;
- dropout drawn in training (`torch.nn.functional.dropout` and its kin,
  which the Dropout modules call, with p > 0) is noted: masks drawn per
  forward, which a migration that splits or reorders the forwards draws
  otherwise;
- with ACCELMIGRATE_VERIFY_MAP_CUDA=1 on a machine without CUDA, the
  script's CUDA placements go to this machine's device
  (`cuda_on_host`), and how many were mapped is recorded;
- with ACCELMIGRATE_VERIFY_MIRROR=SOURCE:COPY (the run is in a mirror of
  SOURCE made by `side_folders`), what the script writes through a link of
  the mirror lands in the copy.

After K optimizer steps the script is stopped. The record goes to
FOLDER/rank<RANK>.json; the process then ends at once (a process group left
up must not abort the interpreter's teardown).
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import sys
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from . import cuda_on_host
from .device import chosen_device
from .script_runner import StopScript, run_script
from .side_folders import Guard

SEED = 0
LOW_PRECISION = (torch.float16, torch.bfloat16)
DROPOUTS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


class Recorder:
    """Losses and parameter checksums, one entry per optimizer step."""

    def __init__(self, steps_wanted: int) -> None:
        self.steps_wanted = steps_wanted
        self.steps: list[dict[str, Any]] = []
        self.low_precision: set[str] = set()
        self._pending_loss = 0.0
        self._backwards = 0
        self._scaled: dict[int, float] = {}  # id of a scaled loss -> the loss's value
        self._optimizers: list[Any] = []
        self.random_per_forward: set[str] = set()
        self.batch_statistics = False
        self._last_batch: Optional[int] = None  # samples in the batch a DataLoader yielded last
        self._pending_samples: Optional[int] = 0

    def install(self, batch_scale: int) -> None:
        register_optimizer_step_post_hook(self._on_optimizer_step)
        self._probe_backward()
        self._probe_grad_scaler()
        self._probe_autocast()
        self._probe_dropout()
        self._probe_batch_norm()
        self._probe_batches()
        if batch_scale > 1:
            _scale_batches(batch_scale)

    def _probe_dropout(self) -> None:
        recorder = self
        for name in DROPOUTS:
            original = getattr(F, name, None)
            if original is None:
                continue

            def dropout(input, p=0.5, training=True, *args, _original=original, _name=name, **kwargs):
                if training and p > 0 and torch.is_grad_enabled():
                    recorder.random_per_forward.add(_name)
                return _original(input, p, training, *args, **kwargs)

            setattr(F, name, dropout)

    def _probe_batch_norm(self) -> None:
        recorder, original = self, F.batch_norm

        def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, *args, **kwargs):
            if training and torch.is_grad_enabled():
                recorder.batch_statistics = True
            return original(input, running_mean, running_var, weight, bias, training, *args, **kwargs)

        F.batch_norm = batch_norm

    def _probe_batches(self) -> None:
        recorder, original = self, _BaseDataLoaderIter.__next__

        def __next__(iterator):
            batch = original(iterator)
            recorder._last_batch = _samples(batch)
            return batch

        _BaseDataLoaderIter.__next__ = __next__

    def _probe_backward(self) -> None:
        recorder, original = self, torch.autograd.backward

        def backward(tensors, *args, **kwargs):
            roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
            for root in roots:
                recorder._note_backward(root)
            return original(tensors, *args, **kwargs)

        torch.autograd.backward = backward

    def _note_backward(self, root: torch.Tensor) -> None:
        value = self._scaled.pop(id(root), None)
        if value is None:
            value = float(root.detach().float().sum())
        self._pending_loss += value
        self._backwards += 1
        if self._pending_samples is not None:
            self._pending_samples = None if self._last_batch is None else self._pending_samples + self._last_batch

    def _probe_grad_scaler(self) -> None:
        recorder, original = self, torch.amp.GradScaler.scale

        def scale(scaler, outputs):
            scaled = original(scaler, outputs)
            if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor):
                recorder._scaled[id(scaled)] = float(outputs.detach().float().sum())
            return scaled

        torch.amp.GradScaler.scale = scale

    def _probe_autocast(self) -> None:
        recorder, original = self, torch.autocast.__enter__

        def enter(context):
            if getattr(context, "_enabled", False) and getattr(context, "fast_dtype", None) in LOW_PRECISION:
                recorder.low_precision.add(str(context.fast_dtype).replace("torch.", ""))
            return original(context)

        torch.autocast.__enter__ = enter

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if not any(optimizer is seen for seen in self._optimizers):
            self._optimizers.append(optimizer)
        self.steps.append(
            {
                "optimizer": next(i for i, seen in enumerate(self._optimizers) if seen is optimizer),
                "loss": self._pending_loss if self._backwards else None,
                "backwards": self._backwards,
                "params": _checksum(optimizer),
                "samples": self._pending_samples if self._backwards else None,
            }
        )
        self._pending_loss, self._backwards, self._pending_samples = 0.0, 0, 0
        if len(self.steps) >= self.steps_wanted:
            raise StopScript()


def _samples(batch: Any) -> Optional[int]:
    """The leading size of the first tensor in a batch (a tensor, or a tuple,
    list or dict of them), None where it holds none."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    return next((found for found in map(_samples, values) if found is not None), None)


def _checksum(optimizer) -> list[float]:
    """Sum and sum of squares of the optimizer's parameters, in float64."""
    total = squares = 0.0
    with torch.no_grad():
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                values = parameter.detach().to(torch.float64)
                total += float(values.sum())
                squares += float((values * values).sum())
    return [total, squares]


def _scale_batches(factor: int) -> None:
    """DataLoaders built with a `batch_size` get `factor` times larger batches."""
    original = DataLoader.__init__

    def __init__(loader, dataset, batch_size: Optional[int] = 1, *args, **kwargs):
        if batch_size is not None and kwargs.get("batch_sampler") is None:
            batch_size = batch_size * factor
        original(loader, dataset, batch_size, *args, **kwargs)

    DataLoader.__init__ = __init__


def _seed_everything() -> None:
    random.seed(SEED)
    torch.manual_seed(SEED)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(SEED)


def _keep_writes_in_the_mirror() -> None:
    """Writes reaching through the mirror's links land in the copy; torch.save
    of a path writes from C++, so it is unfolded before too."""
    mirror = os.environ.get("ACCELMIGRATE_VERIFY_MIRROR")
    if not mirror:
        return
    source, copy = mirror.split(os.pathsep, 1)
    guard = Guard(source, copy)
    guard.install()
    original = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):
            guard.unfold(f, keep_content=False)
        return original(obj, f, *args, **kwargs)

    torch.save = save


def _map_cuda() -> Optional[cuda_on_host.CudaOnHost]:
    if os.environ.get("ACCELMIGRATE_VERIFY_MAP_CUDA") != "1" or torch.cuda.is_available():
        return None
    return cuda_on_host.install(chosen_device())


def main(argv: Optional[list[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.exit("usage: python -m accelmigrate.runtime.verifying SCRIPT [ARGS...] (started by `accelmigrate verify`)")
    folder = os.environ["ACCELMIGRATE_VERIFY_OUT"]
    faulthandler.enable()
    recorder = Recorder(int(os.environ.get("ACCELMIGRATE_VERIFY_STEPS", "10")))
    recorder.install(int(os.environ.get("ACCELMIGRATE_VERIFY_BATCH_SCALE", "1")))
    _keep_writes_in_the_mirror()
    cuda = _map_cuda()
    _seed_everything()
    status, exit_code, error = run_script(argv[0], argv[1:])
    record = {
        "status": status,
        "exit_code": exit_code,
        "error": error,
        "steps": recorder.steps,
        "low_precision": sorted(recorder.low_precision),
        "random_per_forward": sorted(recorder.random_per_forward),
        "batch_statistics": recorder.batch_statistics,
        "cuda_mapped_to": str(cuda.target) if cuda is not None and cuda.mapped else None,
    }
    rank = os.environ.get("RANK", "0")
    with open(os.path.join(folder, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


if __name__ == "__main__":
    main()
