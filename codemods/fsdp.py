"""fsdp: one process -> sharded data parallelism with FSDP2 (`fully_shard`).

What it does
    Turns a script that trains one model in one process into one that
    trains it in as many processes as it is launched with (`accelmigrate
    run`, torchrun, SLURM tasks), each rank holding only a shard of the
    parameters, gradients and optimizer state, and that still behaves as
    before when started with plain `python train.py` (a world of one). It
    is the `ddp` migration (see `accelmigrate explain ddp`: the process
    group joined at the entry point, a `SeededDistributedSampler` and a
    per-process batch for each training DataLoader, `set_epoch`, output on
    rank 0, loop exits decided by rank 0), with the model sharded instead
    of wrapped:

    - `shard_model(model)` once the model is on its device (in place of
      `nn.DataParallel`, or before the optimizer is built): each block held
      in an `nn.ModuleList` is sharded, then the whole model, in place. The
      variable still holds the user's module, so its methods and attributes
      keep working; in a world of one it does nothing;
    - `torch.save(model.state_dict(), path)` becomes
      `save_full_state_dict(model, path)`, on every rank: the full state
      dict is gathered by a collective, then rank 0 writes it, with the keys
      of the bare model (no `module.`, `_orig_mod.` or FSDP prefix);
    - `model.load_state_dict(state)` becomes `load_full_state_dict(model,
      state)`: the full dict, loaded into each rank's shards;
    - an `if` around such a save or load whose test each rank computes for
      itself (`if val_loss < best:`) becomes `if rank_zero_decides(...)`.

Why
    DistributedDataParallel keeps a whole copy of the model, its gradients
    and its optimizer state on every GPU: a model that does not fit on one
    GPU does not train at all. FSDP2 splits each of them across the ranks
    and gathers one block's parameters just for its forward and backward:
    memory per GPU falls with the number of GPUs, at the cost of an
    all-gather per block. It is PyTorch's current form of the old "split
    the model across GPUs" advice.

Example
    Before::

        model = Transformer(vocab, layers=12).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        loader = DataLoader(train_set, batch_size=64, shuffle=True)
        for epoch in range(10):
            for x, y in loader:
                ...
            print(f"epoch {epoch}")
        torch.save(model.state_dict(), "model.pt")

    After::

        init_distributed()
        model = Transformer(vocab, layers=12).to(device)
        shard_model(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        loader = DataLoader(train_set, batch_size=per_process_batch_size(64), sampler=SeededDistributedSampler(train_set, shuffle=True))
        for epoch in range(10):
            loader.sampler.set_epoch(epoch)
            for x, y in loader:
                ...
            if is_main_process():
                print(f"epoch {epoch}")
        save_full_state_dict(model, "model.pt")

Left alone (a finding says what to do by hand)
    Everything `ddp` leaves alone; and: an optimizer built before the point
    where the model is ready to shard (FSDP2 replaces the parameters, so it
    would hold the old ones); several trained models (a GAN: this version
    shards one model); a state dict of the model used other than by
    `torch.save(model.state_dict(), path)` (a dict of several states, a
    copy kept in memory) or the whole model pickled with `torch.save(model,
    ...)`; a script that `ddp` migrated already (choose one of the two).
    The optimizer's state dict holds each rank's shard (AM765: gather it
    with torch.distributed.checkpoint); methods of the model other than
    `forward` called outside training (`model.generate(...)`), and tracing
    or inspecting tools, find the parameters sharded (AM768:
    `register_fsdp_forward_method`, or do it before sharding). A gathered
    save or load in a function that is called under a condition some ranks
    may not take is not seen (only the `if`s in its own function are).
    FSDP2 runs on CUDA (nccl) and, in recent torch, on CPU with gloo.
"""

from __future__ import annotations

import libcst as cst

from ._base import keyword_arg, walk
from ._ddp.common import CannotMigrate, Var, first_positional
from ._fsdp.checkpoints import SHARDING, ShardedCheckpoints
from .ddp import DistributedDataParallelCodemod
from .script import vocabulary as v

ADDED_SHARDING_NAMES = frozenset({"shard_model", "save_full_state_dict", "load_full_state_dict"})
# ddp's titles that speak of DistributedDataParallel's own wrap: fsdp has its own.
DDP_ONLY_CODES = frozenset({"AM503"})


class FullyShardedCodemod(ShardedCheckpoints, DistributedDataParallelCodemod):
    word = "fsdp"
    needs_torch = (2, 6)  # fully_shard in torch.distributed.fsdp
    reads_handoffs = False  # a sharded model handed to another module's loop: not yet
    excludes = ("ddp",)  # one wrapper of the model: FSDP or DDP (AM767)
    summary = "one process -> FSDP2: the model sharded across processes, DistributedSampler, rank-0 output, gathered checkpoints"
    requires = ("device", "main-guard")
    codes = {
        **{code: title for code, title in DistributedDataParallelCodemod.codes.items() if code not in DDP_ONLY_CODES},
        "AM760": "trained model not sharded across the processes (FSDP2 `fully_shard`)",
        "AM761": "optimizer built before the model is sharded",
        "AM762": "state dict or module of the model used where its shards cannot be gathered",
        "AM763": "model state dict saved without gathering its shards",
        "AM764": "model state dict loaded without spreading it over the shards",
        "AM765": "optimizer state dict saved or loaded as one rank's shard",
        "AM766": "several trained models: fsdp shards one",
        "AM767": "script wrapped in DistributedDataParallel: fsdp and ddp exclude each other",
        "AM768": "model used outside forward (own methods, tracing) where its parameters are sharded",
        "AM769": "save or load of the model under a condition each rank decides for itself",
    }
    triggers = ("DataParallel", "DataLoader", "optim", "local_rank", "local-rank", "backward")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._collective_saves: set[cst.CSTNode] = set()
        self._decisions_planned: set[cst.CSTNode] = set()

    def _use(self, *names: str) -> None:
        for name in names:
            if name in ADDED_SHARDING_NAMES:
                if name not in self._needed:
                    self._needed.add(name)
                    self.add_import(SHARDING, name)
            else:
                super()._use(name)

    # -- refusals -----------------------------------------------------------------------

    def _refuse_if_already_distributed(self) -> None:
        super()._refuse_if_already_distributed()
        wrapped = self._calls_to(v.DISTRIBUTED_DATA_PARALLEL)
        if wrapped:
            raise CannotMigrate(
                wrapped[0], "AM767",
                "the model is wrapped in DistributedDataParallel (by `ddp`?): fsdp changed nothing; choose one of "
                "the two: run fsdp on the script before ddp, alone",
            )

    def _refuse_on_name_clash(self) -> None:
        super()._refuse_on_name_clash()
        for name in sorted(ADDED_SHARDING_NAMES):
            for node in self._uses.names.get(name, ()):
                if not self._is_member_name(node) and not self._from_sharding(node):
                    raise CannotMigrate(
                        node, "AM530",
                        f"`{name}` already names something in this file, and the migrated code needs that name: "
                        f"rename yours, then run fsdp again",
                    )

    def _from_sharding(self, node: cst.Name) -> bool:
        return f"{SHARDING}.{node.value}" in self.qualified_names(node) or self._imported_from(node, SHARDING)

    # -- the model: sharded in place ----------------------------------------------------

    def _plan_models(self) -> list[Var]:
        sharded = self._sharded_before()
        if sharded:
            # Nothing to shard again; output that calls these models stays on every rank.
            return sharded
        models = super()._plan_models()
        if len(models) > 1:
            raise CannotMigrate(
                self._optimizer_calls()[0] if self._optimizer_calls() else self._uses.backward_calls[0], "AM766",
                f"several models train here ({', '.join(f'`{m.code}`' for m in models)}): fsdp shards one model in "
                f"this version and changed nothing; use ddp, or shard each model by hand with "
                f"`fully_shard` (torch.distributed.fsdp) before its optimizer is built",
            )
        return models

    def _sharded_before(self) -> list[Var]:
        """In a file fsdp migrated already, the models given to `shard_model`."""
        found: list[Var] = []
        for call in self._uses.calls:
            if not (isinstance(call.func, cst.Name) and call.func.value == "shard_model" and self._from_sharding(call.func)):
                continue
            model = first_positional(call)
            var = self._var_of(model.value) if model is not None else None
            if var is not None and var not in found:
                found.append(var)
        return found

    def _ddp_wrap(self, model: Var, trailing=None, local_buffers: bool = False, unused: bool = False) -> cst.SimpleStatementLine:
        statement = cst.parse_statement(f"shard_model({model.code}){self._module.default_newline}", config=self._config)
        if trailing is not None and trailing.comment is not None:
            statement = statement.with_changes(trailing_whitespace=trailing)
        return statement

    def _plan_wrap_step(self, model, anchor, node, code, message, apply, local_buffers: bool = False) -> None:
        self._check_model_uses(model, anchor)
        self._refuse_optimizer_before(model, anchor)
        if self._sums_gradients(model):
            # FSDP averages the ranks' gradients in its reduce-scatter: with the global
            # batch split, a loss summed over it would step 1/world of the original's.
            raise CannotMigrate(
                node, "AM760",
                f"the loss of `{model.code}` sums over the batch, and FSDP averages the ranks' gradients (the step would be "
                f"1/world of the original's): after `shard_model({model.code})`, call `set_gradient_divide_factor(1.0)` on "
                f"every FSDP module of it by hand, or make the loss a mean and scale the learning rate",
            )

        def shard() -> None:
            self._use("shard_model")
            apply()

        replaced = "in place of `DataParallel`" if code == "AM502" else "once it is on its device"
        self._step(
            node, code if code == "AM502" else "AM760",
            f"`shard_model({model.code})` {replaced}: FSDP2 shards each block of its nn.ModuleLists, then the "
            f"whole model, in place (nothing in a world of one); the optimizer is built after it",
            shard, core=True,
        )

    def _refuse_optimizer_before(self, model: Var, anchor: cst.CSTNode) -> None:
        """Sharding replaces the parameters: an optimizer built, or given a
        list of parameters taken, before the shard would keep the old ones."""
        shard_line = self._position(anchor, end=True)[0]
        for optimizer in self._optimizer_calls():
            if model not in self._models_trained_by(optimizer):
                continue
            if self._position(optimizer)[0] <= shard_line or self._parameters_taken_before(optimizer, shard_line):
                raise CannotMigrate(
                    optimizer, "AM761",
                    f"the optimizer is built, or its parameters taken, before `{model.code}` is ready to shard, and "
                    f"sharding replaces the parameters: fsdp changed nothing; make the model final and on its device "
                    f"first (moves, DataParallel), then take its parameters and build the optimizer, and run fsdp again",
                )

    def _parameters_taken_before(self, optimizer: cst.Call, line: int) -> bool:
        """`params = [p for p in model.parameters() ...]` assigned by `line`, then `SGD(params, ...)`."""
        given = first_positional(optimizer) or keyword_arg(optimizer, "params")
        names = [n for n in walk(given.value) if isinstance(n, cst.Name)] if given is not None else []
        return any(
            self._position(value)[0] <= line and self._takes_parameters(value)
            for name in names
            for value in self._assigned_values(name)
        )

    @staticmethod
    def _takes_parameters(value: cst.BaseExpression) -> bool:
        return any(
            isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in ("parameters", "named_parameters")
            for n in walk(value)
        )

    def _plan_model_references(self, model: Var, had_data_parallel: bool) -> None:
        self._plan_sharded_references(model)

    def _plan_guard(self, statement: cst.CSTNode, kind: str) -> bool:
        """A gathered save runs on every rank (rank 0 writes): no guard, yet a
        write that the reads after it wait for."""
        if statement in self._collective_saves:
            return True
        return super()._plan_guard(statement, kind)


__all__ = ["FullyShardedCodemod"]
