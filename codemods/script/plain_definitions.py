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

The lowest torch these run on is 2.3 (`torch.amp.GradScaler(device_type)`).
"""

import contextlib
import importlib.util
import inspect
import os
import weakref

import torch

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


_SCALERS = weakref.WeakKeyDictionary()


def scaler_for(optimizer, device, dtype, enabled=True, **options):
    """`optimizer`'s one GradScaler, made at the first call, so that the loss scale
    carries over from one call to the next.
    """
    if optimizer is None:
        return grad_scaler(device, dtype, enabled=False)
    if optimizer not in _SCALERS:
        _SCALERS[optimizer] = grad_scaler(device, dtype, enabled, **options)
    return _SCALERS[optimizer]


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
