"""Sharded data parallelism (FSDP2, `fully_shard`) for scripts migrated with `fsdp`.

Each rank keeps only its share of the parameters, gradients and optimizer
state, and gathers a block's full parameters just for its forward and
backward: a model that does not fit on one device still trains, and one
that does leaves room for larger batches.

- `shard_model(model)`: shards each block (every module held in an
  `nn.ModuleList`, the repeated layers of a transformer or a ResNet stage
  list), then the whole model, in place: the module keeps its class's
  methods and attributes. In a world of one it does nothing, so the script
  still runs as `python train.py`. Build the optimizer after it: sharding
  replaces the parameters. A `torch.compile` wrapper is seen through, here
  and below: the module it calls is sharded, and keys carry no `_orig_mod.`.
- `full_state_dict(model)`: the whole model's state dict with plain tensors
  on the CPU, gathered from every rank; every rank must call it (it is a
  collective), and rank 0 gets the full dict (the others an empty one).
- `save_full_state_dict(model, path)`: gathers it and saves it on rank 0:
  a checkpoint with the keys of the bare model.
- `load_full_state_dict(model, state)`: loads such a dict into a sharded
  model (from rank 0's copy, to every rank).

Imports torch and the standard library only.
"""

from __future__ import annotations

from typing import Any

import torch

from accelmigrate.codemods.script.plain_definitions import _blocks_of as blocks_of  # the modules of nn.ModuleLists, outermost first

from .distributed import is_distributed, is_main_process, unwrap_model


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    if not is_distributed():
        return model
    from torch.distributed.fsdp import fully_shard

    # Under a torch.compile wrapper, the module it calls is the one to shard.
    bare = unwrap_model(model)
    for block in blocks_of(bare):
        fully_shard(block)
    fully_shard(bare)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    if not is_distributed():
        return False  # nothing is sharded without a process group; no fsdp import needed
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    model = unwrap_model(model)  # a compiled model's keys would carry `_orig_mod.`
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_full_state_dict(model: torch.nn.Module, path: Any) -> None:
    state = full_state_dict(model)  # every rank takes part in the gathering
    if is_main_process():
        torch.save(state, path)


def load_full_state_dict(model: torch.nn.Module, state: dict[str, Any], strict: bool = True) -> Any:
    model = unwrap_model(model)
    if not is_sharded(model):
        return model.load_state_dict(state, strict=strict)
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
    # A copy: torch replaces the dict's entries with this rank's shards in place,
    # and the caller's dict must stay the full one.
    return set_model_state_dict(model, dict(state), options=options)


__all__ = ["blocks_of", "full_state_dict", "is_sharded", "load_full_state_dict", "save_full_state_dict", "shard_model"]
