"""The process group of a launch, and what scripts do around it.

`init_distributed()` joins the process group that torchrun (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or SLURM (one task per
GPU: SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS) describes: nccl when this
process computes on CUDA, gloo otherwise, with the rank's GPU made current.
It tears the group down when the interpreter exits, after an uncaught
exception too. Started with plain `python train.py`, a process is a world of
one: no process group, and every helper below behaves as a single process
would (`is_main_process()` is True, sums are the local values, a model is
not wrapped).

Helpers that migrated scripts call: `is_distributed()`, `is_main_process()`,
`global_rank()`, `world_size()`, `ddp_device_ids(model)`,
`unwrap_model(model)`, `per_process_batch_size(batch_size)`, `barrier()`,
`sum_across_ranks(...)`, `average_across_ranks(...)`, `mean_across_ranks(total,
count)`,
`rank_zero_decides(condition)`, `rank_local_buffers()`,
`draw_rank_share(draw, batch, *size)` and `rank_share(batch)` (a batch drawn
without a DataLoader); and `SeededDistributedSampler`, the training
DataLoader's sampler (`sharded_loader_kwargs(dataset, kwargs)` where the
DataLoader is given `**kwargs`).

Imports torch and the standard library only.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import gc
import inspect
import multiprocessing
import os
import re
import time
from typing import Any, Callable, Iterator, Optional, Union

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from . import env
from .device import get_device

Number = Union[int, float, torch.Tensor]

# A SLURM job without MASTER_PORT meets on a port derived from its job id, so
# that two jobs sharing a node do not pick the same one.
_SLURM_PORT_BASE = 15000
_SLURM_PORT_SPAN = 20000

global_rank = env.rank
local_rank = env.local_rank
world_size = env.world_size
is_main_process = env.is_main_process


def is_distributed() -> bool:
    """This process belongs to an initialised process group.

    Raises when the launch has several processes but this one never joined
    them: wrapping nothing while DistributedSampler shards the data would
    silently train a different model on every rank."""
    if dist.is_available() and dist.is_initialized():
        return True
    if env.world_size() > 1 and multiprocessing.parent_process() is None:
        raise RuntimeError(
            f"launched as {env.world_size()} processes, but this one has not joined their process group: "
            f"call accelmigrate.runtime.distributed.init_distributed() at the start of the program"
        )
    return False


def _in_group() -> bool:
    return dist.is_available() and dist.is_initialized()


def init_distributed(timeout: Optional[datetime.timedelta] = None) -> bool:
    """Join the launch's process group; True when there is one to join.

    A world of one process (plain `python train.py`) joins nothing. Neither
    does a process that `multiprocessing` started, e.g. a DataLoader worker
    that re-imported the script under the spawn or forkserver start methods:
    only the launched process is a rank. Calling it again does nothing.
    """
    if _in_group():
        return True
    if env.world_size() <= 1 or multiprocessing.parent_process() is not None:
        return False
    _fill_slurm_rendezvous()
    device = get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"timeout": timeout} if timeout is not None else {}
    dist.init_process_group(backend, rank=env.rank(), world_size=env.world_size(), **kwargs)
    atexit.register(destroy_distributed)
    return True


def destroy_distributed() -> None:
    """Leave the process group, if this process is in one.

    Done while the interpreter is whole (at exit, before its shutdown). A
    gloo worker thread frees each finished collective after the caller has
    seen it complete, and that needs the GIL when the collective came from
    DistributedDataParallel's hooks; a thread that asks for the GIL once the
    interpreter is shutting down is ended, and the process aborts
    ("terminate called without an active exception"). The collections and
    the short pause here hand the GIL to those threads first; objects in
    reference cycles that hold the group (a DDP model and its hooks) go too."""
    if _in_group():
        gloo = dist.get_backend() == "gloo"
        gc.collect()
        dist.destroy_process_group()
        gc.collect()
        if gloo:
            time.sleep(0.05)


@contextlib.contextmanager
def distributed_session(timeout: Optional[datetime.timedelta] = None) -> Iterator[bool]:
    """`with distributed_session():` joins the process group and leaves it at
    the end of the block, whether it ends normally or by an exception."""
    try:
        yield init_distributed(timeout)
    finally:
        destroy_distributed()


def ddp_device_ids(model: torch.nn.Module) -> Optional[list[int]]:
    """`device_ids` for DistributedDataParallel: the CUDA device the model's
    parameters are on, or None for a model on the CPU (or any other device)."""
    for parameter in model.parameters():
        if parameter.device.type == "cuda":
            return [parameter.device.index if parameter.device.index is not None else torch.cuda.current_device()]
        return None
    return None


def rank_local_buffers() -> dict:
    """Keyword arguments for DistributedDataParallel that leave each rank's
    buffers (BatchNorm statistics) alone during forward passes, for a model
    called several times before one backward. This torch's spelling: newer
    versions deprecate `broadcast_buffers` for `forward_sync_buffers`."""
    return dict(_rank_local_buffer_keywords())


@functools.lru_cache(maxsize=None)
def _rank_local_buffer_keywords() -> tuple:
    accepted = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    if "forward_sync_buffers" in accepted:
        return (("forward_sync_buffers", False),)
    return (("broadcast_buffers", False),)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside DistributedDataParallel, DataParallel or
    torch.compile, whose state_dict keys carry no `module.` prefix."""
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    while True:
        if isinstance(model, wrappers):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def per_process_batch_size(batch_size: int) -> int:
    """This process's share of a batch that DataParallel used to split across
    GPUs: the global batch (and so the steps per epoch and the learning-rate
    schedule) stays what it was."""
    world = env.world_size()
    if batch_size % world != 0:
        raise ValueError(
            f"a batch of {batch_size} cannot be split evenly across {world} processes: "
            f"choose a batch size divisible by {world}, or keep {batch_size} per process "
            f"(and scale the learning rate) yourself"
        )
    return batch_size // world


def draw_rank_share(draw: Callable[..., torch.Tensor], batch: int, *size: int, **kwargs: Any) -> torch.Tensor:
    """This rank's share of a random draw sized by the batch (a GAN's noise,
    `torch.randn(batch, latent)`, where `batch` is this process's share of
    the original batch): `draw(batch * world, *size)`, the draw the original
    made for its whole batch, made alike on every rank (their generators are
    seeded alike and stay in step), and this rank's rows of it,
    `rank, rank + world, ...`: the rows the original drew for the samples
    that SeededDistributedSampler gives this rank. The ranks' shares then
    differ and together make up the original's draw; in a world of one it is
    `draw(batch, *size)` itself."""
    world = env.world_size()
    if world == 1:
        return draw(batch, *size, **kwargs)
    return draw(batch * world, *size, **kwargs)[env.rank() :: world].contiguous()  # `.view()` as before


def rank_share(batch: Any, summed: bool = False) -> Any:
    """This rank's share of a batch the script draws without a DataLoader
    (`X[i:i + B]`, a whole data set tensor, what a `get_batch()` returns):
    its rows `rank, rank + world, ...`, as DistributedSampler would give this
    rank of the global batch, so that the ranks' shares together are the
    original's batch. A NumPy array is shared as a tensor is; a tuple, list
    or dict item by item; what is neither (or has no rows) is returned as it
    is, and so is everything in a world of one.

    The ranks' gradients are averaged: that is the original's gradient of a
    mean loss only when the shares are equal, so a batch whose rows do not
    divide evenly by the world size is given whole to every rank (each rank
    then computes the original's gradient itself). A loss summed over the
    batch (`summed=True`, whose gradients `sum_gradients_across_ranks` adds
    up) needs disjoint shares whatever their sizes: they are always taken."""
    world = env.world_size()
    if world == 1:
        return batch
    if isinstance(batch, dict):
        return type(batch)((key, rank_share(value, summed)) for key, value in batch.items())
    if isinstance(batch, (tuple, list)):
        shared = [rank_share(item, summed) for item in batch]
        return type(batch)(*shared) if hasattr(batch, "_fields") else type(batch)(shared)
    rows = _rows(batch)
    if rows is None or (rows % world != 0 and not summed):
        return batch
    share = batch[env.rank() :: world]
    return share.contiguous() if isinstance(share, torch.Tensor) else share  # `.view()` as before


def _rows(batch: Any) -> Optional[int]:
    """The number of rows of a tensor or a NumPy array; None for anything else."""
    shape = getattr(batch, "shape", None)
    if isinstance(batch, (torch.Tensor,)) or (shape is not None and hasattr(batch, "__getitem__") and type(batch).__module__ == "numpy"):
        return int(shape[0]) if len(shape) > 0 else None
    return None


def sharded_loader_kwargs(dataset: Dataset, kwargs: dict, split_batch: bool = True) -> dict:
    """The keyword arguments of a training `DataLoader(dataset, **kwargs)`
    for this rank: what `kwargs` holds (it is not changed), with a
    SeededDistributedSampler in place of `shuffle=` (shuffling as that did,
    from the same `generator=`, which the DataLoader keeps for its workers)
    and, unless `split_batch` is False, this process's share of
    `batch_size` (see `per_process_batch_size`)."""
    for name in ("sampler", "batch_sampler"):
        if kwargs.get(name) is not None:
            raise ValueError(
                f"a training DataLoader given its own `{name}=`: it must give each rank a different share of the "
                f"data (see DistributedSampler), or every rank trains on the same samples"
            )
    sharded = {key: value for key, value in kwargs.items() if key not in ("sampler", "batch_sampler", "shuffle")}
    shuffle = bool(kwargs.get("shuffle") or False)
    sharded["sampler"] = SeededDistributedSampler(dataset, shuffle=shuffle, generator=kwargs.get("generator"))
    if split_batch and kwargs.get("batch_size", 1) is not None:  # None: samples one by one, nothing to split
        sharded["batch_size"] = per_process_batch_size(kwargs.get("batch_size", 1))
    return sharded


def set_loader_epoch(loader: Any, epoch: int) -> None:
    """`loader.sampler.set_epoch(epoch)` where the loader has a sampler that
    takes an epoch (a DistributedSampler); any other loader is left as it is.
    A training loop in a module of its own calls this on the loader it is
    handed: the script that ddp migrated hands it a sharded one, another
    caller may hand it a plain one."""
    sampler = getattr(loader, "sampler", None)
    if callable(getattr(sampler, "set_epoch", None)):
        sampler.set_epoch(epoch)


class SeededDistributedSampler(DistributedSampler):
    """A DistributedSampler for this launch whose order is the one the
    original `DataLoader(shuffle=True)` drew, from the script's own seeding.

    Each time it is iterated it shuffles exactly as the RandomSampler of
    `shuffle=True` did (a seed drawn from torch's global generator, or the
    DataLoader's `generator`), so in a world of one (plain `python train.py`)
    the order of every epoch, and what the random stream yields after it, are
    the original's. Across ranks, rank 0's order is broadcast and each rank
    takes every world-size-th index of it: rank r's k-th batch holds the
    original's k-th batch's indices r, r + world, ..., so the ranks' batches
    of one step together make up the original batch, and N processes train
    on the very batches one process did. `set_epoch` is accepted and not
    needed: every epoch draws a new order, as the original did."""

    def __init__(
        self, dataset: Dataset, shuffle: bool = False, generator: Optional[torch.Generator] = None, drop_last: bool = False
    ) -> None:
        super().__init__(dataset, num_replicas=env.world_size(), rank=env.rank(), shuffle=shuffle, drop_last=drop_last)
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            return super().__iter__()
        order = list(RandomSampler(self.dataset, generator=self.generator))  # the original's draw, on every rank
        if self.num_replicas == 1:
            return iter(order)
        return iter(self._share_of(_rank_zero_order(order)))

    def _share_of(self, order: list[int]) -> list[int]:
        """This rank's indices of `order`, padded or cut to a multiple of the
        world size as DistributedSampler does."""
        if self.drop_last:
            order = order[: self.total_size]
        else:
            while len(order) < self.total_size:
                order += order[: self.total_size - len(order)]
        return order[self.rank : self.total_size : self.num_replicas]


def _rank_zero_order(order: list[int]) -> list[int]:
    """Rank 0's order on every rank: the ranks' shares then never overlap,
    even where their random streams have drifted apart."""
    if not _in_group():
        return order
    indices = torch.tensor(order, dtype=torch.int64, device=_collective_device())
    dist.broadcast(indices, src=0)
    return indices.tolist()


def barrier() -> None:
    """Wait for every rank (e.g. before reading a file that rank 0 writes).
    Every rank must call it: never inside an `if is_main_process():` branch."""
    if _in_group():
        dist.barrier()


@contextlib.contextmanager
def main_process_first() -> Iterator[None]:
    """`with main_process_first():` around a download into a shared folder
    (`datasets.MNIST(root, download=True)`): rank 0 runs the block first, then
    the first process of each other node (a disk of its own), then the rest,
    who find the files there. Every rank must enter it; a world of one just
    runs the block."""
    if not _in_group():
        yield
        return
    turn = 0 if dist.get_rank() == 0 else 1 if env.local_rank() == 0 else 2
    for _ in range(turn):
        dist.barrier()
    yield
    for _ in range(2 - turn):
        dist.barrier()


def rank_zero_decides(condition: object) -> bool:
    """Rank 0's truth value of `condition`, on every rank: a loop that leaves
    on a value each rank computes for itself (its own loss, a metric) leaves
    on every rank at once, where ranks deciding alone would wait forever in
    the next collective. Every rank must call it, at the same point."""
    decision = bool(condition)
    if _in_group():
        flag = torch.tensor([int(decision)], dtype=torch.int64, device=_collective_device())
        dist.broadcast(flag, src=0)
        decision = bool(flag.item())
    return decision


def sum_across_ranks(*values: Number) -> Any:
    """The sums over all ranks of each value, in one all-reduce, each of its
    own type: an int stays an int, a float a float, a tensor a tensor of its
    shape, dtype and device. One value gives its sum, several a tuple."""
    summed = _across_ranks(values)
    return summed[0] if len(summed) == 1 else tuple(summed)


def average_across_ranks(*values: Number) -> Any:
    """The means over all ranks of each value (as `sum_across_ranks`): a
    running total of per-batch means, each rank's over its share of every
    batch, averaged into the one-process total."""
    averaged = [value / dist.get_world_size() for value in _across_ranks(values)] if _in_group() else list(values)
    return averaged[0] if len(averaged) == 1 else tuple(averaged)


def mean_across_ranks(total: Number, count: Number) -> float:
    """A metric over every rank's share of the data: the sum of the totals
    divided by the sum of the counts (never the mean of per-rank means, which
    weighs a rank with fewer samples as much as one with more)."""
    total_sum, count_sum = (float(v) for v in _across_ranks((total, count)))
    return total_sum / count_sum if count_sum else float("nan")


def _across_ranks(values: tuple) -> list:
    """VALUES summed over the ranks, each kept in its own type."""
    if not _in_group():
        return list(values)
    parts = [v.detach().reshape(-1).to(torch.float64).cpu() if isinstance(v, torch.Tensor) else torch.tensor([float(v)], dtype=torch.float64) for v in values]
    flat = torch.cat(parts).to(_collective_device())
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    sums = flat.cpu().split([part.numel() for part in parts])
    return [_like(value, total) for value, total in zip(values, sums)]


def _like(value: Number, total: torch.Tensor) -> Number:
    if isinstance(value, torch.Tensor):
        return total.reshape(value.shape).to(dtype=value.dtype, device=value.device)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(round(total.item()))
    return total.item()


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _fill_slurm_rendezvous() -> None:
    """srun's tasks know their rank but not where to meet: rank 0's node,
    the first of the job's node list."""
    if not env.launched_by_slurm_tasks():
        return
    if "MASTER_ADDR" not in os.environ:
        os.environ["MASTER_ADDR"] = first_slurm_host(os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST") or "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        job_id = int(os.environ.get("SLURM_JOB_ID", "0") or 0)
        os.environ["MASTER_PORT"] = str(_SLURM_PORT_BASE + job_id % _SLURM_PORT_SPAN)


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list: `gpu[07-09,12],cpu01` -> `gpu07`."""
    first = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if first is None:
        return nodelist
    prefix, ranges = first.group(1), first.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


__all__ = [
    "SeededDistributedSampler",
    "average_across_ranks",
    "barrier",
    "ddp_device_ids",
    "destroy_distributed",
    "draw_rank_share",
    "distributed_session",
    "first_slurm_host",
    "global_rank",
    "init_distributed",
    "is_distributed",
    "is_main_process",
    "local_rank",
    "mean_across_ranks",
    "per_process_batch_size",
    "rank_local_buffers",
    "rank_share",
    "rank_zero_decides",
    "set_loader_epoch",
    "sharded_loader_kwargs",
    "sum_across_ranks",
    "unwrap_model",
    "world_size",
]
