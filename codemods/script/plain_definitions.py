"""The plain definitions a migrated file carries instead of importing the runtime.

This module is read as text, never imported by the tool (which needs no
torch): `plain_code` copies the definition of each helper a migrated file
would import from `accelmigrate.runtime` into that file, once, after its
imports, with the definitions it uses, so that the file needs torch and the
standard library only.

Each is the runtime's helper without what only the tool needs (the
ACCELMIGRATE_* switches that tests and `verify` turn, SLURM's variables):
what an engineer would write by hand. `REPLACES` names the runtime module
each stands for; a function of a file with one of these names and the same
docstring is that helper, so that the codemods know it again when the file
is migrated once more.

A definition named `<name>_before_<major>_<minor>` (with the same
docstring) is `<name>` as a project confined to an older torch gets it
(accelmigrate/project/torch_version.py): the GradScaler of torch.cuda.amp
before 2.3. With it, the lowest torch these run on is 1.12
(`torch.backends.mps`); fully_shard (the sharding helpers) needs 2.6, as the
fsdp word says.
"""

import atexit
import contextlib
import gc
import importlib.util
import inspect
import multiprocessing
import os
import time
import weakref

import torch
import torch.distributed as dist

REPLACES = {
    "default_num_workers": "accelmigrate.runtime.data",
    "get_device": "accelmigrate.runtime.device",
    "device_at": "accelmigrate.runtime.device",
    "device_ids_for": "accelmigrate.runtime.device",
    "default_backend": "accelmigrate.runtime.backend",
    "tensor_type": "accelmigrate.runtime.legacy",
    "autocast_dtype": "accelmigrate.runtime.precision",
    "grad_scaler": "accelmigrate.runtime.precision",
    "scaler_for": "accelmigrate.runtime.precision",
    "full_precision": "accelmigrate.runtime.precision",
    "no_sync_unless": "accelmigrate.runtime.batch",
    "use_tf32_matmul": "accelmigrate.runtime.speed",
    "should_compile": "accelmigrate.runtime.speed",
    "to_channels_last": "accelmigrate.runtime.speed",
    "fused_on_cuda": "accelmigrate.runtime.speed",
    "unwrap_model": "accelmigrate.runtime.distributed",
    "ddp_device_ids": "accelmigrate.runtime.distributed",
    "rank_local_buffers": "accelmigrate.runtime.distributed",
    "world_size": "accelmigrate.runtime.distributed",
    "is_main_process": "accelmigrate.runtime.distributed",
    "is_distributed": "accelmigrate.runtime.distributed",
    "init_distributed": "accelmigrate.runtime.distributed",
    "destroy_distributed": "accelmigrate.runtime.distributed",
    "per_process_batch_size": "accelmigrate.runtime.distributed",
    "SeededDistributedSampler": "accelmigrate.runtime.distributed",
    "barrier": "accelmigrate.runtime.distributed",
    "main_process_first": "accelmigrate.runtime.distributed",
    "rank_zero_decides": "accelmigrate.runtime.distributed",
    "sum_across_ranks": "accelmigrate.runtime.distributed",
    "average_across_ranks": "accelmigrate.runtime.distributed",
    "draw_rank_share": "accelmigrate.runtime.distributed",
    "set_loader_epoch": "accelmigrate.runtime.distributed",
    "NullWriter": "accelmigrate.runtime.rank_zero",
    "sum_gradients_across_ranks": "accelmigrate.runtime.gradients",
    "rank_share": "accelmigrate.runtime.distributed",
    "sharded_loader_kwargs": "accelmigrate.runtime.distributed",
    "shard_model": "accelmigrate.runtime.sharding",
    "full_state_dict": "accelmigrate.runtime.sharding",
    "save_full_state_dict": "accelmigrate.runtime.sharding",
    "load_full_state_dict": "accelmigrate.runtime.sharding",
}


def default_num_workers(max_workers=8):
    """DataLoader workers for this process: its CPU cores shared among the processes
    torchrun started on this machine, 1 to max_workers.
    """
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    share = max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    if max_workers is not None:
        share = min(share, max_workers)
    return share


def get_device():
    """The device this process computes on: its GPU (the LOCAL_RANK-th under torchrun,
    the SLURM_LOCALID-th under srun), else Apple's mps, else the CPU.
    """
    if torch.cuda.is_available():
        local_rank = int(
            os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", 0))
        )
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def device_at(index=None):
    """What `.cuda(index)` means where CUDA is available; elsewhere the device
    get_device() chooses.
    """
    if not torch.cuda.is_available():
        return get_device()
    if index is None:
        return torch.device("cuda")
    return (
        torch.device("cuda", index) if isinstance(index, int) else torch.device(index)
    )


def device_ids_for(device):
    """DistributedDataParallel's device_ids for a module placed on `device`: its GPU, or
    None off CUDA.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return [device.index if device.index is not None else torch.cuda.current_device()]


def default_backend():
    """The process group's backend: nccl where this process computes on a GPU, gloo
    elsewhere.
    """
    return "nccl" if torch.cuda.is_available() else "gloo"


def tensor_type(dtype, device):
    """The legacy constructor (torch.FloatTensor, torch.cuda.FloatTensor, ...) of
    `dtype` tensors on `device`.
    """
    device = torch.device(device)
    name = {
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
    }[dtype]
    if device.type == "cpu":
        return getattr(torch, name)
    if device.type == "cuda" and device.index in (None, torch.cuda.current_device()):
        return getattr(torch.cuda, name)
    return lambda *args, **kwargs: getattr(torch, name)(*args, **kwargs).to(device)


def autocast_dtype(device):
    """The type autocast computes in on `device`: bfloat16 on GPUs that have it, float16
    on older GPUs and mps, float32 (autocast off) on the CPU.
    """
    kind = torch.device(device).type
    if kind == "cpu":
        return torch.float32
    if kind == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float16 if kind == "mps" else torch.bfloat16


def grad_scaler(device, dtype, enabled=True, **options):
    """A GradScaler that scales float16 losses only (bfloat16 and float32 need no loss
    scaling).
    """
    return torch.amp.GradScaler(
        torch.device(device).type,
        enabled=bool(enabled) and dtype == torch.float16,
        **options,
    )


def grad_scaler_before_2_3(device, dtype, enabled=True, **options):
    """A GradScaler that scales float16 losses only (bfloat16 and float32 need no loss
    scaling).
    """
    on_cuda = torch.device(device).type == "cuda"
    return torch.cuda.amp.GradScaler(
        enabled=bool(enabled) and dtype == torch.float16 and on_cuda, **options
    )


def scaler_for(optimizer, device, dtype, enabled=True, **options):
    """`optimizer`'s one GradScaler, made at the first call, so that the loss scale
    carries over from one call to the next.
    """
    if optimizer is None:
        return grad_scaler(device, dtype, enabled=False)
    scalers = scaler_for.__dict__.setdefault("scalers", weakref.WeakKeyDictionary())
    if optimizer not in scalers:
        scalers[optimizer] = grad_scaler(device, dtype, enabled, **options)
    return scalers[optimizer]


def full_precision(value):
    """`value` with its float16 and bfloat16 tensors (in a list or tuple too) as
    float32, which numpy can read.
    """
    if isinstance(value, torch.Tensor):
        return (
            value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
        )
    if type(value) in (list, tuple):
        return type(value)(full_precision(v) for v in value)
    return value


@contextlib.contextmanager
def no_sync_unless(sync, *models):
    """Within it, the models' gradients are all-reduced across processes only when
    `sync` (DistributedDataParallel's no_sync, FSDP2's gradient sync off otherwise).
    """
    with contextlib.ExitStack() as stack:
        for model in () if sync else models:
            if callable(getattr(model, "no_sync", None)):
                stack.enter_context(model.no_sync())
            elif callable(getattr(model, "set_requires_gradient_sync", None)):
                model.set_requires_gradient_sync(False)
                stack.callback(model.set_requires_gradient_sync, True)
        yield


def use_tf32_matmul():
    """float32 matrix products on CUDA in TF32, which Ampere and later GPUs run several
    times faster; CPU matmuls keep their precision.
    """
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = "tf32"
    else:
        matmul.allow_tf32 = True


def should_compile(model):
    """Compile where the model is on a GPU that triton generates kernels for; on a CPU a
    short run never wins the compile time back.
    """
    first = next(model.parameters(), None)
    if (
        first is None
        or first.device.type != "cuda"
        or importlib.util.find_spec("triton") is None
    ):
        return False
    return torch.cuda.get_device_capability(first.device) >= (7, 0)


def to_channels_last(value):
    """A module on CUDA, or a 4-D CUDA tensor, in the channels-last memory format cuDNN
    reads fastest; anything else as it is.
    """
    if isinstance(value, torch.nn.Module):
        first = next(value.parameters(), None)
        on_cuda = first is not None and first.device.type == "cuda"
        return value.to(memory_format=torch.channels_last) if on_cuda else value
    if (
        isinstance(value, torch.Tensor)
        and value.dim() == 4
        and value.device.type == "cuda"
    ):
        return value.contiguous(memory_format=torch.channels_last)
    return value


def fused_on_cuda(*modules):
    """`fused=` for Adam, AdamW and SGD: True when every parameter of the modules is a
    floating-point CUDA tensor.
    """
    parameters = [p for module in modules for p in module.parameters()]
    return bool(parameters) and all(
        p.device.type == "cuda" and p.is_floating_point() for p in parameters
    )


def unwrap_model(model):
    """The module inside DistributedDataParallel, DataParallel or torch.compile, whose
    state_dict keys have no `module.` prefix.
    """
    while True:
        if isinstance(
            model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
        ):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def ddp_device_ids(model):
    """DistributedDataParallel's device_ids: the GPU the model's parameters are on, or
    None for a model off CUDA.
    """
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cuda":
        return None
    return [
        (
            first.device.index
            if first.device.index is not None
            else torch.cuda.current_device()
        )
    ]


def rank_local_buffers():
    """DistributedDataParallel's keywords that leave each process's BatchNorm statistics
    alone in forward passes, as this torch spells them.
    """
    accepted = inspect.signature(
        torch.nn.parallel.DistributedDataParallel.__init__
    ).parameters
    return (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in accepted
        else {"broadcast_buffers": False}
    )


def world_size():
    """The number of processes torchrun started (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", 1))


def is_main_process():
    """True in the first process torchrun started (rank 0), and without torchrun."""
    return int(os.environ.get("RANK", 0)) == 0


def is_distributed():
    """This process has joined the process group of its launch (init_distributed())."""
    if dist.is_available() and dist.is_initialized():
        return True
    if world_size() > 1 and multiprocessing.parent_process() is None:
        raise RuntimeError(
            f"launched as {world_size()} processes, but this one has not joined their "
            "process group: call init_distributed() at the start of the program"
        )
    return False


def init_distributed():
    """Join the process group torchrun set up (nccl on GPUs, gloo elsewhere), and leave
    it at exit; True when there is one. A process of its own, or one that
    multiprocessing started (a DataLoader worker), joins none.
    """
    if dist.is_available() and dist.is_initialized():
        return True
    if world_size() <= 1 or multiprocessing.parent_process() is not None:
        return False
    dist.init_process_group("nccl" if get_device().type == "cuda" else "gloo")
    atexit.register(destroy_distributed)
    return True


def destroy_distributed():
    """Leave the process group while the interpreter is whole: gloo's threads free
    DistributedDataParallel's finished collectives, and need the GIL for it first.
    """
    if dist.is_available() and dist.is_initialized():
        gloo = dist.get_backend() == "gloo"
        gc.collect()
        dist.destroy_process_group()
        gc.collect()
        if gloo:
            time.sleep(0.05)


def per_process_batch_size(batch_size):
    """This process's share of `batch_size`: together the processes still take the
    whole batch a step, and the steps per epoch stay as they were.
    """
    if batch_size % world_size() != 0:
        raise ValueError(
            f"a batch of {batch_size} cannot be split evenly across {world_size()} "
            "processes: choose a batch size they divide"
        )
    return batch_size // world_size()


class SeededDistributedSampler(torch.utils.data.distributed.DistributedSampler):
    """A DistributedSampler whose order is the one DataLoader(shuffle=True) drew from
    the script's seed: rank 0's order, of which each process takes every
    world-size-th index, so that the processes' batches of one step make up the batch
    of the one-process run.
    """

    def __init__(self, dataset, shuffle=False, generator=None, drop_last=False):
        rank = int(os.environ.get("RANK", 0))
        super().__init__(
            dataset, world_size(), rank, shuffle=shuffle, drop_last=drop_last
        )
        self.generator = generator

    def __iter__(self):
        if not self.shuffle:
            return super().__iter__()
        sampler = torch.utils.data.RandomSampler(self.dataset, generator=self.generator)
        order = list(sampler)
        if self.num_replicas == 1:
            return iter(order)
        if dist.is_initialized():
            shared = torch.tensor(order, device=_collective_device())
            dist.broadcast(shared, src=0)
            order = shared.tolist()
        if self.drop_last:
            order = order[: self.total_size]
        while len(order) < self.total_size:
            order += order[: self.total_size - len(order)]
        return iter(order[self.rank : self.total_size : self.num_replicas])


def _collective_device():
    """Where tensors for a collective live: the current GPU with nccl, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier():
    """Wait for every process (before reading a file rank 0 writes); every process must
    call it.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def main_process_first():
    """Rank 0 runs the block first (a download into a shared folder), then the first
    process of each other machine, then the rest, who find the files there.
    """
    if not (dist.is_available() and dist.is_initialized()):
        yield
        return
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    turn = 0 if dist.get_rank() == 0 else 1 if local_rank == 0 else 2
    for _ in range(turn):
        dist.barrier()
    yield
    for _ in range(2 - turn):
        dist.barrier()


def rank_zero_decides(condition):
    """Rank 0's truth value of `condition` on every process, so that all of them leave
    a loop at once.
    """
    decision = bool(condition)
    if dist.is_available() and dist.is_initialized():
        flag = torch.tensor([int(decision)], device=_collective_device())
        dist.broadcast(flag, src=0)
        decision = bool(flag.item())
    return decision


def sum_across_ranks(*values):
    """The sums over all processes of each value, in one all-reduce, each of its own
    type (an int stays an int, a tensor a tensor); one value gives its sum.
    """
    summed = _across_ranks(values)
    return summed[0] if len(summed) == 1 else tuple(summed)


def average_across_ranks(*values):
    """The means over all processes of each value (per-batch means of each process's
    share, averaged into the one-process figure); one value gives its mean.
    """
    if dist.is_available() and dist.is_initialized():
        values = [value / dist.get_world_size() for value in _across_ranks(values)]
    return values[0] if len(values) == 1 else tuple(values)


def _across_ranks(values):
    """The values summed over the processes, each kept in its own type."""
    if not (dist.is_available() and dist.is_initialized()):
        return list(values)
    parts = [
        torch.as_tensor(value).detach().reshape(-1).to("cpu", torch.float64)
        for value in values
    ]
    flat = torch.cat(parts).to(_collective_device())
    dist.all_reduce(flat)
    sums = flat.cpu().split([part.numel() for part in parts])
    return [_like(value, total) for value, total in zip(values, sums)]


def _like(value, total):
    """`total` in the type of `value`."""
    if isinstance(value, torch.Tensor):
        return total.reshape(value.shape).to(dtype=value.dtype, device=value.device)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(round(total.item()))
    return total.item()


def draw_rank_share(draw, batch, *size, **kwargs):
    """This process's rows of the random draw the one-process run made for its whole
    batch (`draw(batch * world, ...)`, alike on every process): the rows of the
    samples SeededDistributedSampler gives it.
    """
    if world_size() == 1:
        return draw(batch, *size, **kwargs)
    rank = int(os.environ.get("RANK", 0))
    return draw(batch * world_size(), *size, **kwargs)[
        rank :: world_size()
    ].contiguous()


def set_loader_epoch(loader, epoch):
    """`loader.sampler.set_epoch(epoch)` where its sampler takes an epoch."""
    sampler = getattr(loader, "sampler", None)
    if callable(getattr(sampler, "set_epoch", None)):
        sampler.set_epoch(epoch)


class NullWriter:
    """A writer that writes nothing (on the processes other than rank 0): every method
    call returns None.
    """

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None


def sum_gradients_across_ranks(model):
    """Make a DistributedDataParallel `model` add up the processes' gradients instead of
    averaging them, for a loss that sums over the batch; nothing for a bare model.
    """
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.register_comm_hook(model.process_group, _all_reduce_sum)


def _all_reduce_sum(group, bucket):
    """torch's default all-reduce hook without its division by the world size."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda done: done.value()[0])


def rank_share(batch, summed=False):
    """This process's rows (rank, rank + world, ...) of a batch drawn without a
    DataLoader, item by item in a tuple, list or dict; the whole batch where its rows
    do not divide evenly (unless the loss sums over it: `summed`), and in a world of
    one.
    """
    world = world_size()
    if world == 1:
        return batch
    if isinstance(batch, dict):
        return type(batch)(
            (key, rank_share(value, summed)) for key, value in batch.items()
        )
    if isinstance(batch, (tuple, list)):
        shared = [rank_share(item, summed) for item in batch]
        return (
            type(batch)(*shared) if hasattr(batch, "_fields") else type(batch)(shared)
        )
    shape = getattr(batch, "shape", None)
    is_array = isinstance(batch, torch.Tensor) or type(batch).__module__ == "numpy"
    if not is_array or shape is None or len(shape) == 0:
        return batch
    if shape[0] % world != 0 and not summed:
        return batch
    share = batch[int(os.environ.get("RANK", 0)) :: world]
    return share.contiguous() if isinstance(share, torch.Tensor) else share


def sharded_loader_kwargs(dataset, kwargs, split_batch=True):
    """A training DataLoader's keyword arguments for this process: `kwargs` with a
    SeededDistributedSampler in place of `shuffle=` and, unless `split_batch` is
    False, this process's share of `batch_size`.
    """
    for name in ("sampler", "batch_sampler"):
        if kwargs.get(name) is not None:
            raise ValueError(
                f"a training DataLoader given its own `{name}=`: each process must get "
                "a different share of the data (see DistributedSampler)"
            )
    skipped = ("sampler", "batch_sampler", "shuffle")
    sharded = {key: value for key, value in kwargs.items() if key not in skipped}
    sharded["sampler"] = SeededDistributedSampler(
        dataset, shuffle=bool(kwargs.get("shuffle")), generator=kwargs.get("generator")
    )
    if split_batch and kwargs.get("batch_size", 1) is not None:
        sharded["batch_size"] = per_process_batch_size(kwargs.get("batch_size", 1))
    return sharded


def shard_model(model):
    """Shard the model over the processes with FSDP2 (`fully_shard`), in place: each
    block held in an nn.ModuleList first, then the whole model. Nothing to do in a
    world of one. Build the optimizer after it: sharding replaces the parameters.
    """
    if not is_distributed():
        return model
    from torch.distributed.fsdp import fully_shard

    bare = unwrap_model(model)  # under torch.compile, the module it calls
    for block in _blocks_of(bare):
        fully_shard(block)
    fully_shard(bare)
    return model


def _blocks_of(model):
    """The modules of nn.ModuleLists that have parameters, outermost first."""
    found, inside = [], set()
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            for block in module:
                if id(block) not in inside and any(True for _ in block.parameters()):
                    found.append(block)
                    inside.update(id(m) for m in block.modules())
    return found


def _is_sharded(model):
    """The model was sharded by shard_model() in a process group."""
    if not is_distributed():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state_dict(model):
    """The whole model's state dict, plain tensors on the CPU, gathered from every
    rank: every rank must call it; rank 0 gets the full dict, the others an empty one.
    """
    model = unwrap_model(model)
    if not _is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def save_full_state_dict(model, path):
    """Gather the model's full state dict on every rank and save it on rank 0, with the
    keys of the bare model.
    """
    state = full_state_dict(model)
    if is_main_process():
        torch.save(state, path)


def load_full_state_dict(model, state, strict=True):
    """Load a full state dict (rank 0's copy, sent to every rank) into a sharded model."""
    model = unwrap_model(model)
    if not _is_sharded(model):
        return model.load_state_dict(state, strict=strict)
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    options = StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True, strict=strict
    )
    # a copy: torch puts this rank's shards in the dict it is given
    return set_model_state_dict(model, dict(state), options=options)
