"""What torch (and the libraries around it) call things, by qualified name.

One home for the names every codemod matches: the optimizer packages, the
learning-rate schedulers, DataLoader, the nn.Module classes, no_grad and
autocast, the device factories. Both the `ast` pre-check and the script model
read these, so a spelling added here reaches every codemod at once.
"""

from __future__ import annotations

DATALOADER = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
# Pads a list of sequences into one tensor, time-first unless `batch_first=True`.
PAD_SEQUENCE = frozenset({"torch.nn.utils.rnn.pad_sequence"})
# Modules whose `import *` brings torch's DataLoader in (LibCST leaves the name unresolved).
DATALOADER_MODULES = frozenset({"torch.utils.data", "torch.utils.data.dataloader"})

DATA_PARALLEL = frozenset(
    {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel"}
)
DISTRIBUTED_DATA_PARALLEL = frozenset(
    {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
)
DISTRIBUTED_SAMPLER = frozenset(
    {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
)
# What a script that already runs distributed calls.
ALREADY_DISTRIBUTED = DISTRIBUTED_DATA_PARALLEL | DISTRIBUTED_SAMPLER | {
    "torch.distributed.init_process_group",
    "torch.multiprocessing.spawn",
    "torch.multiprocessing.start_processes",
    # sharded training: a script `fsdp` migrated, or one written for FSDP
    "accelmigrate.runtime.sharding.shard_model",
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed.fsdp.FullyShardedDataParallel",
}

# What the `device` codemod rewrites or reports among torch.cuda's names
# (its pre-check rule reads them too): the GPU selection, the availability
# check, legacy CUDA tensor types (by the dtype each holds) and the
# functions that raise without a GPU (CPU builds assert on them).
SET_DEVICE = frozenset({"torch.cuda.set_device"})
CUDA_DEVICE_CONTEXT = frozenset({"torch.cuda.device"})  # `with torch.cuda.device(i):`
IS_AVAILABLE = frozenset({"torch.cuda.is_available"})
LEGACY_DTYPES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Byte": "uint8",
    "Char": "int8", "Short": "int16", "Int": "int32", "Long": "int64", "Bool": "bool",
}
LEGACY_TYPES = frozenset(f"torch.cuda.{kind}Tensor" for kind in LEGACY_DTYPES)
NEEDS_GPU = frozenset(
    f"torch.cuda.{name}"
    for name in (
        "synchronize", "current_device", "get_device_name", "get_device_properties",
        "get_device_capability", "reset_peak_memory_stats", "reset_max_memory_allocated",
        "Event", "Stream", "current_stream", "default_stream", "stream", "set_stream",
    )
)
DEVICE_CUDA_NAMES = SET_DEVICE | CUDA_DEVICE_CONTEXT | IS_AVAILABLE | LEGACY_TYPES | NEEDS_GPU
EMPTY_CACHE = frozenset({"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"})
TORCH_SAVE = frozenset({"torch.save", "torch.serialization.save"})
TORCH_LOAD = frozenset({"torch.load", "torch.serialization.load"})
AUTOGRAD_BACKWARD = frozenset({"torch.autograd.backward"})
CLIP_GRAD_PREFIX = "torch.nn.utils.clip_grad"

NO_GRAD = frozenset(
    {
        "torch.no_grad",
        "torch.inference_mode",
        "torch.autograd.no_grad",
        "torch.autograd.grad_mode.no_grad",
        "torch.autograd.inference_mode",
        "torch.autograd.grad_mode.inference_mode",
    }
)
AUTOCAST = frozenset(
    {
        "torch.autocast",
        "torch.amp.autocast",
        "torch.amp.autocast_mode.autocast",
        "torch.cuda.amp.autocast",
        "torch.cuda.amp.autocast_mode.autocast",
        "torch.cpu.amp.autocast",
        "torch.cpu.amp.autocast_mode.autocast",
    }
)
# Every mixed-precision API of torch lives under one of these.
AMP_PREFIXES = ("torch.amp.", "torch.cuda.amp.", "torch.cpu.amp.")
# The bare names of the mixed-precision API (also reached by `import *`).
AMP_NAMES = frozenset({"autocast", "GradScaler", "custom_fwd", "custom_bwd"})

DEVICE_FACTORIES = frozenset(
    {
        "torch.device",
        "accelmigrate.runtime.device.get_device",
        "accelmigrate.runtime.get_device",
        "accelmigrate.runtime.device.device_at",  # a process's own GPU, or the runtime's device
    }
)

VARIABLE = frozenset({"torch.autograd.Variable", "torch.autograd.variable.Variable"})

# -- optimizers and schedulers -------------------------------------------------

OPTIMIZER_PACKAGES = (
    "torch.optim.",
    "torch.distributed.optim.",
    "apex.optimizers.",
    "bitsandbytes.optim.",
    "torch_optimizer.",
    "timm.optim.",
    "lion_pytorch.",
)
# Optimizer classes that live in packages of other things.
OPTIMIZER_CLASSES = frozenset(
    {
        "transformers.AdamW",
        "transformers.Adafactor",
        "transformers.optimization.AdamW",
        "transformers.optimization.Adafactor",
        "bitsandbytes.optim.AdamW8bit",
    }
)
# What a hand-written optimizer class derives from.
OPTIMIZER_BASES = frozenset({"torch.optim.Optimizer", "torch.optim.optimizer.Optimizer"})
# Functions that build an optimizer.
OPTIMIZER_FACTORIES = frozenset({"timm.optim.create_optimizer", "timm.optim.create_optimizer_v2"})
NOT_OPTIMIZERS = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")


def makes_optimizer(qualified: str) -> bool:
    """Does calling `qualified` make an optimizer? `torch.optim.SGD`,
    `apex.optimizers.FusedAdam`, `transformers.AdamW`, timm's factories (classes
    are named with a capital; the schedulers under torch.optim are not optimizers)."""
    if qualified in OPTIMIZER_CLASSES or qualified in OPTIMIZER_FACTORIES:
        return True
    last = qualified.rsplit(".", 1)[-1]
    return qualified.startswith(OPTIMIZER_PACKAGES) and not qualified.startswith(NOT_OPTIMIZERS) and last[:1].isupper()


def is_scheduler(qualified: str) -> bool:
    """A learning-rate scheduler's class or factory (torch, transformers, timm ...)."""
    if qualified.startswith("torch.optim.lr_scheduler."):
        return qualified.rsplit(".", 1)[-1][:1].isupper()
    if qualified == "torch.optim.swa_utils.SWALR":
        return True
    module, _, last = qualified.rpartition(".")
    if not module:
        return False
    return "schedul" in last.lower() or module.split(".")[-1] in ("lr_scheduler", "scheduler")


# -- modules, losses, datasets -----------------------------------------------------

# Under torch.nn, the modules that hold no layers.
_NOT_MODULES = ("torch.nn.functional.", "torch.nn.init.", "torch.nn.utils.", "torch.nn.parameter.")
_NOT_MODULE_CLASSES = frozenset({"torch.nn.Parameter", "torch.nn.UninitializedParameter", "torch.nn.Buffer"})
# The arguments of a loss that `reduction=` replaced.
LEGACY_REDUCTION = ("size_average", "reduce")
# The initialisers torch keeps under their pre-0.4 names only as deprecated aliases.
DEPRECATED_INIT = frozenset(
    {"uniform", "normal", "constant", "eye", "dirac", "xavier_uniform", "xavier_normal",
     "kaiming_uniform", "kaiming_normal", "orthogonal", "sparse"}
)  # fmt: skip
# Packages whose lower-case functions build models (`torchvision.models.resnet18()`).
MODEL_FACTORY_PREFIXES = ("torchvision.models.", "timm.create_model", "transformers.AutoModel")


def is_module_class(qualified: str) -> bool:
    """A torch.nn layer or container class (`torch.nn.Linear`, `torch.nn.Module`)."""
    if not qualified.startswith("torch.nn.") or qualified.startswith(_NOT_MODULES) or qualified in _NOT_MODULE_CLASSES:
        return False
    return qualified.rsplit(".", 1)[-1][:1].isupper()


# Layers with no parameters that scripts use as their criterion (SimSiam's negative cosine similarity).
_DISTANCES = frozenset({"CosineSimilarity", "PairwiseDistance"})


def is_loss_class(qualified: str) -> bool:
    """`torch.nn.CrossEntropyLoss`, `torch.nn.MSELoss`, `torch.nn.CosineSimilarity`: a criterion, not a model."""
    return is_module_class(qualified) and (qualified.endswith("Loss") or qualified.rsplit(".", 1)[-1] in _DISTANCES)


def is_model_factory(qualified: str) -> bool:
    if qualified.startswith("torchvision.models."):
        last = qualified.rsplit(".", 1)[-1]
        return last[:1].islower() and not last.startswith("get_weight")
    return qualified.startswith(MODEL_FACTORY_PREFIXES[1:])


DATASET_BASES = frozenset(
    {
        "torch.utils.data.Dataset",
        "torch.utils.data.dataset.Dataset",
        "torch.utils.data.IterableDataset",
        "torch.utils.data.dataset.IterableDataset",
    }
)
ITERABLE_DATASET_BASES = frozenset({"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"})


def is_dataset_factory(qualified: str) -> bool:
    """A call that makes a dataset: torch's dataset classes and `random_split`,
    torchvision's and torchtext's datasets, a Hugging Face `load_dataset`."""
    if qualified.startswith(("torch.utils.data.", "torch.utils.data.dataset.")):
        last = qualified.rsplit(".", 1)[-1]
        return last.endswith("Dataset") or last in ("Subset", "random_split")
    if qualified.startswith(("torchvision.datasets.", "torchtext.datasets.", "torchaudio.datasets.")):
        return True
    return qualified in ("datasets.load_dataset",)


# Methods of a module that return the module itself: `Net().to(device)` is still the model.
SELF_RETURNING_MODULE_METHODS = frozenset(
    {"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval", "type", "requires_grad_", "to_empty"}
)

# Parameters that receive a device (`def train(model, loader, device)`).
DEVICE_PARAMETER_NAMES = frozenset({"device", "dev", "gpu"})


# The logging methods of a logger (and functions of the logging module).
LOG_LEVELS = ("debug", "info", "warning", "warn", "error", "exception", "critical", "log")
LOGGING_CALLS = frozenset(f"logging.{level}" for level in LOG_LEVELS)  # the logging module's own functions


__all__ = [
    "DEVICE_PARAMETER_NAMES",
    "LOG_LEVELS",
    "LOGGING_CALLS",
    "ALREADY_DISTRIBUTED",
    "AMP_NAMES",
    "AMP_PREFIXES",
    "AUTOCAST",
    "AUTOGRAD_BACKWARD",
    "DATALOADER",
    "DATALOADER_MODULES",
    "DATA_PARALLEL",
    "DATASET_BASES",
    "DEVICE_FACTORIES",
    "DISTRIBUTED_DATA_PARALLEL",
    "DISTRIBUTED_SAMPLER",
    "EMPTY_CACHE",
    "ITERABLE_DATASET_BASES",
    "NO_GRAD",
    "OPTIMIZER_BASES",
    "SELF_RETURNING_MODULE_METHODS",
    "TORCH_LOAD",
    "TORCH_SAVE",
    "VARIABLE",
    "is_dataset_factory",
    "is_loss_class",
    "is_model_factory",
    "is_module_class",
    "makes_optimizer",
    "is_scheduler",
]
