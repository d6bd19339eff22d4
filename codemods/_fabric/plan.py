"""Planning the move onto Lightning Fabric: the accelerate planner's reading
(codemods/_accelerate/plan.py), with what Fabric does differently.

- `fabric.setup(model, *its optimizers)` and `fabric.setup_dataloaders(...)`
  in place of one `accelerator.prepare(...)`; schedulers stay as they are
  (they step the optimizer that Fabric's wrapper drives);
- each process loads `batch_size // fabric.world_size`: Fabric gives every
  training loader a DistributedSampler and does not split batches, so the
  global batch stays the original's;
- `fabric.clip_gradients(model, optimizer, ...)`, which clips the
  optimizer's parameters (the model's, where the optimizer was made from
  `model.parameters()`);
- checkpoints stay `torch.save(...)` under `if fabric.is_global_zero:`:
  Fabric's module answers `state_dict()` with the bare module's keys, and
  the model's own attributes as the bare module, so nothing is unwrapped.
"""

from __future__ import annotations

import libcst as cst

from .._accelerate.common import PER_PROCESS_BATCHES, CannotMigrate, statement
from .._accelerate.plan import THROUGH_UNWRAP, WRAPPER_SAFE, Planner
from .._accelerate.totals import reduction_of
from .._base import CLIP_GRAD_FUNCTIONS, code_of, dotted_name, keyword_arg
from ..script.accumulate_facts import (
    _is_lengthless_dataset as is_iterable_dataset,  # an IterableDataset class of the file
)
from .common import (
    ADDED_NAMES,
    FABRIC,
    PRECISIONS,
    fabric_call,
    fabric_statements,
    strided_rows,
    untranslated,
    world_share,
)

FABRIC_IMPORTS = ("lightning_fabric", "lightning", "pytorch_lightning")
CLIP_SETTINGS = {"clip_grad_norm_": ("max_norm", "norm_type", "error_if_nonfinite"), "clip_grad_norm": ("max_norm", "norm_type", "error_if_nonfinite"), "clip_grad_value_": ("clip_val",)}


class FabricPlanner(Planner):
    own_rows = staticmethod(strided_rows)
    dispatches_shuffled_loaders = False  # the DistributedSampler draws from its own generator on every process

    @staticmethod
    def combined_total(total) -> str:
        """`fabric.all_reduce`, which makes a number a tensor (an int an int32, a float a float32: a float goes in
        as float64 to come back exact)."""
        reduction = reduction_of(total)
        if total.python_type is None:
            return f'{total.name} = {FABRIC}.all_reduce({total.name}, reduce_op="{reduction}")'
        value = total.name if total.python_type == "int" and reduction == "sum" else f"torch.tensor({total.name}, dtype=torch.float64)"
        return f'{total.name} = {FABRIC}.all_reduce({value}, reduce_op="{reduction}").item()'

    def make(self):
        plan = super().make()
        self._refuse_unsplit_batches()
        self._refuse_untranslated(plan)
        return plan

    def _refuse_untranslated(self, plan) -> None:
        """What the accelerate planner wrote that has no Fabric spelling (its metrics' gathering) is refused."""
        # The edits take the original's nodes as well as their updated copies (the same shape).
        written = [(node, edit(node)) for node, edit in plan.edits.items()]
        written += [(node, s) for inserted in (plan.before, plan.after) for node, lines in inserted.items() for s in lines]
        for node, new in written:
            missing = untranslated(new)
            if missing:
                raise CannotMigrate(node, "AM820", f"here `--to accelerate` would write `{missing}(...)`, which Fabric has no call for: fabric changed nothing; migrate this part by hand")

    # -- refusals -------------------------------------------------------------------------

    def _refuse_if_already_distributed(self) -> None:
        for binding in self.script.imports:
            qualified = binding.qualified or ""
            if qualified.split(".")[0] in FABRIC_IMPORTS:
                raise CannotMigrate(binding.node, "AM822", f"this script already imports `{qualified}`: fabric changed nothing")
        super()._refuse_if_already_distributed()

    def _refuse_on_name_clash(self) -> None:
        # `accelerator` too: the inherited edits are built on that name, then renamed.
        for name in (*ADDED_NAMES, "accelerator"):
            for node in self.uses.names.get(name, ()):
                parent = self.codemod.parent(node)
                if isinstance(parent, cst.Attribute) and parent.attr is node or isinstance(parent, cst.Arg) and parent.keyword is node:
                    continue
                raise CannotMigrate(node, "AM825", f"`{name}` already names something in this file, and the migrated code needs that name: rename yours, then run fabric again")

    # -- the Fabric object ------------------------------------------------------------------

    def _plan_accelerator(self) -> None:
        super()._plan_accelerator()
        self.plan.imports = [(m, n) for m, n in self.plan.imports if m != "accelerate"] + [("lightning_fabric", "Fabric")] + ([("os", None)] if self.parity else [])
        self.plan.fixes = [fix for fix in self.plan.fixes if fix[1] != "AM801"]
        if self.parity:
            self.plan.fixes.append((self.accelerator_anchor, "AM801", "one `Fabric` made and launched here: it joins torchrun's processes (a world of one under plain `python`, devices * num_nodes = WORLD_SIZE) and picks the device"))
        else:
            self.plan.fixes.append((self.accelerator_anchor, "AM801", "one `Fabric` made and launched here: it joins the processes `fabric run` starts (a world of one under plain `python`) and picks the device; the devices, nodes and the like come from `fabric run`'s options"))

    def _write_accelerator(self) -> None:
        mode = self.precision.mode
        if mode and not mode.startswith(tuple(PRECISIONS)):
            raise CannotMigrate(self.accelerator_anchor, "AM821", f"mixed precision chosen as `{mode}`, which fabric cannot write as one `Fabric(precision=...)`: fabric changed nothing; remove the mixed precision by hand, run fabric again, then pass `precision=\"16-mixed\"` to `Fabric(...)`")
        made, launched = fabric_statements(self.precision.mode, self.cpu, self.parity)
        self.plan.before.setdefault(self.accelerator_anchor, [])[0:0] = [statement(made, self.config), statement(launched, self.config)]
        if not self.parity:
            self.plan.notes.append((self.accelerator_anchor, "AM834", PER_PROCESS_BATCHES))
        for call in self.shuffled_loaders:
            self.plan.notes.append((call, "AM810", "training DataLoader that shuffles (or has its own sampler): in a world of one it keeps the original's order; on N processes Fabric's DistributedSampler draws another (seeded with 0 and the epoch): a seeded run trains as well, not to the same numbers"))

    # -- setup ------------------------------------------------------------------------------

    def _plan_prepare(self, steps) -> set:
        self.setups = None
        prepared = super()._plan_prepare(steps)
        self._keep_evaluation_whole()
        for loader in self.training_loaders if self.parity else ():
            self._plan_batch_share(loader.value)
        return prepared

    def _write_prepare(self, anchor: cst.CSTNode, names: list) -> None:
        """In place of the accelerate planner's `... = accelerator.prepare(...)` line: each model's setup with its
        optimizers, and the training loaders' (evaluation loaders and schedulers stay as they are)."""
        if self.setups is None:
            self.setups = self._setups(self.steps)
        lines = []
        for model, optimizers in self.setups.items():
            if model in names or set(optimizers) & set(names):
                if not {model, *optimizers} <= set(names):
                    raise CannotMigrate(anchor, "AM820", f"`{model}` and its optimizers are made in different places (the entry point, a trainer's `__init__`): fabric changed nothing; set them up by hand")
                listed = ", ".join([model, *optimizers])
                lines.append(f"{listed} = {FABRIC}.setup({listed})")
        loaders = ", ".join(n for n in dict.fromkeys(self._prepared_name(loader) for loader in self.training_loaders) if n in names)
        if loaders:
            lines.append(f"{loaders} = {FABRIC}.setup_dataloaders({loaders})")
        self.plan.after.setdefault(anchor, []).extend(statement(line, self.config) for line in lines)
        self.plan.fixes.append((anchor, "AM802", f"`{FABRIC}.setup(...)` and `{FABRIC}.setup_dataloaders(...)`: the model wrapped for the processes with its optimizers, and each process reads its share of every batch"))

    def _keep_evaluation_whole(self) -> None:
        """Evaluation loaders stay whole, as Fabric leaves a loader it does not set up: every process evaluates
        the full set. Undoes the accelerate planner's sharded evaluation (its `gather_for_metrics` lines, AM813)."""
        for lines in self.plan.after.values():
            lines[:] = [s for s in lines if untranslated(s) != "accelerator.gather_for_metrics"]
        self.plan.fixes = [fix for fix in self.plan.fixes if fix[1] != "AM813"]

    def _setups(self, steps) -> dict[str, list[str]]:
        """model -> the optimizers it is set up with: an optimizer made from `model.parameters()` goes with that
        model (a GAN's generator and discriminator), else with the one model of the steps it takes."""
        setups: dict[str, list[str]] = {self._prepared_name(model): [] for step in steps for model in step.models}
        owner: dict[str, str] = {}
        for step in steps:
            models = list(dict.fromkeys(self._prepared_name(m) for m in step.models))
            for optimizer_step in step.optimizer_steps:
                entity = optimizer_step.entity
                name = self._prepared_name(entity)
                made_from = self._parameters_of(entity if name == entity.name else entity.origin)
                model = made_from if made_from in setups else models[0] if len(models) == 1 else None
                if model is None or owner.get(name, model) != model:
                    raise CannotMigrate(optimizer_step.call, "AM820", f"optimizer `{name}` steps for more than one model: fabric changed nothing; set up each model with its own optimizers by hand (`{FABRIC}.setup_module`, `{FABRIC}.setup_optimizers`)")
                if name not in owner:
                    owner[name] = model
                    setups[model].append(name)
        return setups

    @staticmethod
    def _parameters_of(optimizer) -> str | None:
        """`model` for an optimizer made as `SGD(model.parameters(), ...)`."""
        made = optimizer.value
        first = made.args[0].value if isinstance(made, cst.Call) and made.args and made.args[0].keyword is None else None
        if isinstance(first, cst.Call) and isinstance(first.func, cst.Attribute) and first.func.attr.value == "parameters" and not first.args:
            return dotted_name(first.func.value)
        return None

    def _stepped_per_batch(self, scheduler: str, steps) -> bool:
        return True  # schedulers stay as they are: Fabric has no setup for them (_write_prepare)

    def _made_per_epoch(self, name: str, steps) -> bool:
        return False  # set up anew each epoch, its DistributedSampler would start again from epoch 0: one order every epoch

    def _refuse_models_read_on_the_instance(self) -> None:
        pass  # Fabric's module answers its own attributes and state_dict as the bare module, wherever it is read

    @staticmethod
    def _bare_model(updated):
        return updated  # Fabric's module answers state_dict and its attributes as the bare module

    def _check_returned_loader(self, loader) -> None:
        if not self.parity:
            return super()._check_returned_loader(loader)
        raise CannotMigrate(loader.call, "AM829", f"training DataLoader built in another module: each process must load `batch_size // {FABRIC}.world_size`, set where it is built; fabric changed nothing; build it here, or divide its batch size there by hand")

    def _check_loader(self, loader) -> None:
        call = loader.value
        made_by_a_function = isinstance(call, cst.Call) and not self.script.is_dataloader(call) and self.script.dataloader_made_by(call) is not None
        if made_by_a_function and self.parity:
            raise CannotMigrate(call, "AM929", f"training DataLoader made by `{code_of(call.func)}`: each process must load `batch_size // {FABRIC}.world_size`, set where it is made; fabric changed nothing; make it here, or divide its batch size there by hand")
        super()._check_loader(loader)
        if made_by_a_function:
            return  # by default set up as it comes: each process loads the batch size it was given
        if keyword_arg(call, "batch_sampler") is not None:
            raise CannotMigrate(call, "AM829", "training DataLoader with a `batch_sampler`: Fabric's DistributedSampler cannot share it out; fabric changed nothing; give it a `batch_size` (and a sampler) instead, then run fabric again")
        dataset = keyword_arg(call, "dataset") or (call.args[0] if call.args and call.args[0].keyword is None else None)
        if dataset is not None and is_iterable_dataset(self.script, dataset.value):
            raise CannotMigrate(call, "AM829", "training DataLoader over an IterableDataset: Fabric gives it no sampler, so every process would read all of it; fabric changed nothing; give each process its share of the stream (`fabric.global_rank`, `fabric.world_size`) by hand")
        notes = self.plan.notes
        if notes and notes[-1][0] is call and notes[-1][1] == "AM811":
            notes[-1] = (call, "AM811", "on N processes a data set the number of processes does not divide is completed with its first samples (Fabric's DistributedSampler), and a last partial batch is shared out unevenly; `drop_last=True`, or a data set the batch size divides, keeps the original's steps")

    def _plan_batch_share(self, call: cst.Call) -> None:
        size = keyword_arg(call, "batch_size")
        if size is None:
            positional = [a for a in call.args if a.keyword is None and not a.star]
            if len(positional) < 2:  # the batch size comes in a `**kwargs` dict
                raise CannotMigrate(call, "AM929", f"training DataLoader whose batch size comes through `**kwargs`: each process must load `batch_size // {FABRIC}.world_size`; fabric changed nothing; pass `batch_size=` to this DataLoader, then run fabric again")
            size = positional[1]
        self.plan.edit(size, lambda updated: updated.with_changes(value=world_share(updated.value)))
        self.plan.fixes.append((size, "AM813", f"each process loads `{code_of(size.value)} // {FABRIC}.world_size`: Fabric shares the data set out among the processes, and the global batch stays {code_of(size.value)}"))
        self.batch_sizes = getattr(self, "batch_sizes", []) + [size.value]

    def _refuse_unsplit_batches(self) -> None:
        """A batch known to be odd: two processes load half of one less each."""
        for value in getattr(self, "batch_sizes", ()):
            if isinstance(value, cst.Integer) and int(value.evaluated_value) % 2:
                self.plan.notes.append((value, "AM814", f"batch size {value.value}: an even number of processes cannot split it, so on N processes the global batch becomes N * ({value.value} // N); use a batch size the number of processes divides"))

    # -- clipping -----------------------------------------------------------------------------

    def _plan_clipping(self) -> None:
        for call in self._calls(CLIP_GRAD_FUNCTIONS):
            function = dotted_name(call.func).rsplit(".", 1)[-1]
            if not self.in_entry(call):
                raise CannotMigrate(call, "AM805", f"gradient clipping outside the entry point: fabric changed nothing; call `{FABRIC}.clip_gradients(model, optimizer, ...)` there by hand")
            model, optimizer = self._clipped(call)
            settings = CLIP_SETTINGS[function]
            positional = [a for a in call.args if a.keyword is None]
            keywords = {a.keyword.value: a for a in call.args if a.keyword is not None}
            if len(positional) > len(settings) + 1 or set(keywords) - {"parameters", "max_norm", "norm_type", "error_if_nonfinite", "clip_value", "foreach"} or "foreach" in keywords:
                raise CannotMigrate(call, "AM805", f"`{code_of(call)}` with arguments `{FABRIC}.clip_gradients` does not take: fabric changed nothing; call it by hand")
            values = {name: a.value for name, a in zip(settings, positional[1:])}
            values.update({("clip_val" if k == "clip_value" else k): a.value for k, a in keywords.items() if k != "parameters"})
            # torch's clip_grad_norm_ lets non-finite norms through; Fabric's raises unless told.
            if "max_norm" in values and "error_if_nonfinite" not in values:
                values["error_if_nonfinite"] = cst.Name("False")
            self.plan.edit(call, lambda updated, model=model, optimizer=optimizer, values=values: fabric_call(
                "clip_gradients",
                [cst.Arg(value=cst.Name(model)), cst.Arg(value=cst.Name(optimizer)),
                 *(cst.Arg(keyword=cst.Name(k), value=v, equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))) for k, v in values.items())],
            ))
            self.plan.fixes.append((call, "AM805", f"`{FABRIC}.clip_gradients({model}, {optimizer}, ...)`: clips the gradients the processes share (unscaled first under mixed precision)"))

    def _clipped(self, call: cst.Call) -> tuple[str, str]:
        """The model and its one optimizer, made from `model.parameters()`, whose parameters `call` clips."""
        parameters = keyword_arg(call, "parameters") or (call.args[0] if call.args and call.args[0].keyword is None else None)
        value = parameters.value if parameters is not None else None
        model = dotted_name(value.func.value) if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "parameters" and not value.args else None
        optimizers = self.setups.get(model, []) if model else []
        if len(optimizers) == 1 and self._parameters_of(self._optimizer_entity(optimizers[0])) == model:
            return model, optimizers[0]
        raise CannotMigrate(call, "AM805", f"`{code_of(call)}`: Fabric clips an optimizer's parameters, and this clip is not of one model's parameters with the one optimizer made from them; fabric changed nothing; call `{FABRIC}.clip_gradients(model, optimizer, ...)` by hand")

    def _optimizer_entity(self, name: str):
        """Where the optimizer the entry point names `name` is made (through what a trainer's instance keeps of it)."""
        found = next(s.entity for step in self.script.training_steps for s in step.optimizer_steps if self._prepared_name(s.entity) == name)
        return found.origin if found.name != name else found

    # -- the model behind Fabric's wrapper ---------------------------------------------------

    def _plan_attribute(self, node: cst.Name | cst.Attribute, attribute: cst.Attribute) -> None:
        attr, model = attribute.attr.value, code_of(node)
        if attr in WRAPPER_SAFE or attr in THROUGH_UNWRAP:
            return  # Fabric's module answers these as the bare module (state_dict keys without `module.`)
        if attr == "module":
            if self._had_data_parallel():
                # DataParallel's bare module: Fabric's module answers as it.
                self.plan.edit(attribute, lambda updated: updated.value)
                self.plan.fixes.append((attribute, "AM809", f"`{code_of(attribute)}` -> `{model}`: the model Fabric set up answers state_dict and its own attributes as the bare module"))
            return
        parent = self.codemod.parent(attribute)
        called = isinstance(parent, cst.Call) and parent.func is attribute
        if called and not self.in_entry(node):
            raise CannotMigrate(attribute, "AM824", f"`{code_of(attribute)}(...)` outside the entry point, where it may run while training: a model trained through its own methods skips DDP's gradient synchronisation; fabric changed nothing; call it in the entry point, or mark it with `{model}.mark_forward_method(...)` after `{FABRIC}.setup` by hand")
        if called and self._in_training(node):
            raise CannotMigrate(attribute, "AM824", f"`{code_of(attribute)}(...)` while training: a model trained through its own methods skips DDP's gradient synchronisation; fabric changed nothing; train it through `{model}(...)`, or mark the method with `{model}.mark_forward_method(...)` after `{FABRIC}.setup` by hand")
        # Anything else: Fabric's module hands over the bare module's own attributes.

    def _in_training(self, node: cst.CSTNode) -> bool:
        loop = self.codemod.innermost_loop(node)
        return loop is not None and self.uses.trains(loop.body)
