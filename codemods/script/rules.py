"""Which codemods can apply to a file, from its pre-check facts.

Each rule is a necessary condition for anything its codemod changes or
reports today, read from the codemod's matching (what `visit_Module` and its
`visit_*`/`leave_*` methods look for), so a file that fails it is never
parsed by LibCST for that word. A rule may say yes to a file that the
codemod then leaves alone (that costs time, never correctness); it must
never say no to a file that the codemod would touch: tests/test_script_model.py
proves that over every fixture.

Codemods run one after the other on each other's output, so a word may
find in the file what an earlier word wrote (`workers` writes
`torch.cuda.is_available()`, which mentions CUDA). `INTRODUCES` lists what
each word may write; `words_that_may_apply` adds it to the facts seen by the
words after it, once the earlier word may apply.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

from . import vocabulary as v
from .precheck import ACCUMULATION_CONSTANT, BATCH_SCALE_CONSTANT, DDP_ADDED_NAMES, FSDP_ADDED_NAMES, SourceFacts

Rule = Callable[[SourceFacts], bool]


def _workers(f: SourceFacts) -> bool:
    """A torch DataLoader is constructed (every finding is at such a call)."""
    return f.dataloader_calls > 0


def _item(f: SourceFacts) -> bool:
    """A backward call: the losses it stores are found from it."""
    return f.backward_calls > 0


def _empty_cache(f: SourceFacts) -> bool:
    """torch.cuda.empty_cache is named."""
    return f.empty_cache


def _device(f: SourceFacts) -> bool:
    """A CUDA placement (`.cuda(`, a "cuda..." string), one of torch.cuda's
    names that it rewrites or reports (`set_device`, `is_available`, a legacy
    CUDA tensor type, a call that needs a GPU; anything under a star import
    of torch or torch.cuda), torch.load, a "nccl" backend string, apex, or
    DistributedDataParallel given `device_ids=`. Other torch.cuda calls
    (`torch.cuda.manual_seed`, `memory_allocated`, `torch.cuda.amp`) give
    it nothing to do."""
    return (
        f.cuda_calls > 0
        or f.cuda_strings > 0
        or f.uses(v.DEVICE_CUDA_NAMES)
        or any(module == "torch" or module.startswith("torch.cuda") for module in f.star_imports)
        or f.uses(v.TORCH_LOAD)
        or f.nccl_strings > 0
        or f.apex
        or ("device_ids" in f.names and f.uses(v.DISTRIBUTED_DATA_PARALLEL))
    )


def _amp(f: SourceFacts) -> bool:
    """A backward call (a training step), a no_grad/inference_mode region
    (evaluation), any mixed-precision API (autocast, GradScaler,
    torch.cuda.amp, apex), or a `masked_fill` (a model's fill constant)."""
    return f.backward_calls > 0 or f.no_grad or f.mixed_precision or f.method_calls.get("masked_fill", 0) + f.method_calls.get("masked_fill_", 0) > 0


def _ddp(f: SourceFacts) -> bool:
    """A backward call; else only its refusals can fire: a `--local_rank`
    flag, a script already distributed, a name it needs already taken, a
    DataParallel / DataLoader without a training loop, or an optimizer
    passed to a training loop that lives in another module."""
    return (
        f.backward_calls > 0
        or f.local_rank_flag
        or f.uses(v.ALREADY_DISTRIBUTED | v.DATA_PARALLEL | v.DATALOADER)
        or f.uses_prefix("torch.optim.")  # an optimizer handed to a training loop in another module
        or not f.names.isdisjoint(DDP_ADDED_NAMES)
        or f.dataloader_calls > 0
    )


def _fsdp(f: SourceFacts) -> bool:
    """As ddp (fsdp is ddp's codemod with its own wrap), or a name it adds already taken."""
    return _ddp(f) or not f.names.isdisjoint(FSDP_ADDED_NAMES)


def _sync_bn(f: SourceFacts) -> bool:
    """A DistributedDataParallel wrap (its own or ddp's), or a sign of training
    (DataParallel, DataLoader, torch.optim) where it reports a missing wrap."""
    return _ddp(f) or f.uses(v.DISTRIBUTED_DATA_PARALLEL) or f.uses_prefix("torch.optim.")


def _accumulate(f: SourceFacts) -> bool:
    """A backward call or a `.step(`; or its constant already in the file."""
    return f.backward_calls > 0 or f.optimizer_steps > 0 or ACCUMULATION_CONSTANT in f.module_constants


def _batch_scale(f: SourceFacts) -> bool:
    """A DataLoader or an optimizer constructed; or its constant already in the file."""
    return (
        f.dataloader_calls > 0
        or any(v.makes_optimizer(q) for q in f.calls)
        or BATCH_SCALE_CONSTANT in f.module_constants
    )


def _modernize(f: SourceFacts) -> bool:
    """A pre-0.4 idiom can be there: `x.data[0]` or a running total of `.data`
    read as `total[0]`, Variable, `size_average=`/`reduce=` given to one of
    torch.nn's losses, an old `torch.nn.init` name, `retain_variables=`
    (keywords are among the names), or NVIDIA apex's amp imported."""
    return (
        f.data_zero_subscripts > 0
        or "retain_variables" in f.names
        or (f.data_totals > 0 and f.zero_subscripts > 0)
        or f.uses(v.VARIABLE)
        or "Variable" in (f.names | f.attributes)
        or any(q.startswith("torch.nn.") for q in f.legacy_reduction_calls)
        or f.uses_where(_deprecated_initialiser)
        or any(_deprecated_initialiser(m) for m in f.imported_modules)
        or any(m == "apex.amp" or m.startswith("apex.amp.") for m in f.imported_modules)
    )


def _deprecated_initialiser(qualified: str) -> bool:
    module, _, name = qualified.rpartition(".")
    return module == "torch.nn.init" and name in v.DEPRECATED_INIT


def _main_guard(f: SourceFacts) -> bool:
    """Work that a re-import by a child process must not repeat: a DataLoader,
    a backward call, or processes started (spawn, Process, Pool)."""
    starts = {"spawn", "Process", "Pool", "start_processes"}
    return f.dataloader_calls > 0 or f.backward_calls > 0 or bool(starts & (f.names | f.attributes))


def _library_target(f: SourceFacts) -> bool:
    """What ddp or amp would act on or refuse: accelerate and fabric take over both."""
    return _ddp(f) or _amp(f)


def _training_step(f: SourceFacts) -> bool:
    """A backward call: tf32, cudnn-benchmark, compile and channels-last act
    only on a script with a training step (its model, its start)."""
    return f.backward_calls > 0


def _fused_optim(f: SourceFacts) -> bool:
    """An optimizer constructed (fused-optim looks at torch's Adam, AdamW and SGD)."""
    return any(v.makes_optimizer(q) for q in f.calls)


def _safe_load(f: SourceFacts) -> bool:
    """torch.load called."""
    return f.calls_to(v.TORCH_LOAD) > 0


RULES: Mapping[str, Rule] = {
    "main-guard": _main_guard,
    "modernize": _modernize,
    "workers": _workers,
    "item": _item,
    "empty-cache": _empty_cache,
    "device": _device,
    "amp": _amp,
    "ddp": _ddp,
    "fsdp": _fsdp,
    "accelerate": _library_target,
    "fabric": _library_target,
    "sync-bn": _sync_bn,
    "accumulate": _accumulate,
    "batch-scale": _batch_scale,
    "channels-last": _training_step,
    "fused-optim": _fused_optim,
    "compile": _training_step,
    "tf32": _training_step,
    "cudnn-benchmark": _training_step,
    "safe-load": _safe_load,
}


@dataclasses.dataclass(frozen=True)
class Writes:
    """What a codemod may add to a file, in pre-check terms."""

    references: frozenset = frozenset()
    names: frozenset = frozenset()
    attributes: frozenset = frozenset()
    methods: frozenset = frozenset()


INTRODUCES: Mapping[str, Writes] = {
    "workers": Writes(
        references=frozenset({"torch", "torch.cuda.is_available", "accelmigrate.runtime.data.default_num_workers"}),
        names=frozenset({"torch", "default_num_workers"}),
        attributes=frozenset({"cuda", "is_available"}),
    ),
    "device": Writes(
        references=frozenset({"torch.device", "accelmigrate.runtime.device.get_device"}),
        names=frozenset({"device", "get_device", "compute_device"}),
        methods=frozenset({"to"}),
    ),
    "amp": Writes(
        references=frozenset({"torch.autocast", "torch.amp.GradScaler", "accelmigrate.runtime.precision.grad_scaler"}),
        names=frozenset({"scaler", "amp_dtype", "autocast_dtype", "grad_scaler"}),
        methods=frozenset({"scale", "step", "update", "unscale_"}),
    ),
    "ddp": Writes(
        references=frozenset(v.DISTRIBUTED_DATA_PARALLEL | v.DISTRIBUTED_SAMPLER),
        names=DDP_ADDED_NAMES | {"DistributedSampler"},
        methods=frozenset({"set_epoch"}),
    ),
    "fsdp": Writes(
        references=frozenset(v.DISTRIBUTED_SAMPLER),
        names=DDP_ADDED_NAMES | FSDP_ADDED_NAMES | {"DistributedSampler"},
        methods=frozenset({"set_epoch"}),
    ),
    "sync-bn": Writes(references=frozenset({"torch.nn.SyncBatchNorm.convert_sync_batchnorm"})),
    "accumulate": Writes(names=frozenset({ACCUMULATION_CONSTANT, "no_sync_unless"})),
}


def words_that_may_apply(facts: SourceFacts, words: Sequence[str]) -> list[str]:
    """The words, in the given (running) order, whose codemod may change or
    report something in the file these facts describe. An unknown word is
    kept: without a rule, it may apply."""
    kept = []
    for word in words:
        rule = RULES.get(word)
        if rule is None or rule(facts):
            kept.append(word)
            facts = _with_writes(facts, INTRODUCES.get(word))
    return kept


def _with_writes(facts: SourceFacts, writes) -> SourceFacts:
    if writes is None:
        return facts
    methods = dict(facts.method_calls)
    for method in writes.methods:
        methods[method] = methods.get(method, 0) + 1
    return dataclasses.replace(
        facts,
        references=facts.references | writes.references,
        names=facts.names | writes.names,
        attributes=facts.attributes | writes.attributes,
        method_calls=methods,
    )


__all__ = ["INTRODUCES", "RULES", "Rule", "words_that_may_apply"]
