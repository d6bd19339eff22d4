"""accelerate: a plain PyTorch training script -> Hugging Face Accelerate.

What it does
    Moves a script that trains in one process (with or without
    `nn.DataParallel`) onto `accelerate.Accelerator`, so that the same file
    runs on a CPU, one GPU or many processes (`accelerate launch`, torchrun),
    and computes what the original computed.

    By default it writes what Accelerate's own guide writes: `Accelerator()`
    (with `mixed_precision=` where the script used mixed precision and
    `cpu=` for its own `--no-cuda` flag, nothing else), the prepared model's
    and the training batches' `.to(device)` dropped (codemods/_accelerate/
    placement.py), the processes and devices left to `accelerate launch`.
    On N processes each process loads the loader's batch size: the run is
    the original's with N times larger batches (note AM834), a shuffled
    loader in Accelerate's order (AM835), a scheduler stepped per epoch
    left out of `prepare` (AM836). `accelerate=parity` writes the exact form
    below, which ends a seeded run on N processes with the one-process
    weights:

    - one `Accelerator` made at the start of the entry point (the function
      the `__main__` block calls, or a flat script's first code), with
      `DataLoaderConfiguration(split_batches=True)` (parity): the DataLoader's batch
      size stays the global batch, each process takes its slice of every
      batch, and the steps per epoch stay what they were. (Accelerate 1.x
      ignores `Accelerator(split_batches=True)`: the setting must come through
      the DataLoaderConfiguration.) `cpu=not torch.cuda.is_available()`:
      without it, torchrun's processes on a machine without CUDA each train
      alone; a `--no-cuda` (`--cuda`) store_true flag still keeps the run on
      the CPU (`cpu=args.no_cuda or ...`, made once the arguments are parsed),
      and so does `--device cpu` (`cpu=args.device == "cpu" or ...`) when the
      flag is read only as `device = args.device`;
    - training code in the module's functions that the entry point alone
      calls (pytorch/examples' `train(args, model, device, train_loader,
      optimizer, epoch)` and `test(...)` called from main(); AM801,
      codemods/_accelerate/functions.py): each that needs it gets a parameter
      `accelerator` and `accelerator=accelerator` at its calls, and its code
      is migrated as the entry point's own; what is prepared is what the
      entry point passes it, the same names at every call;
    - a trainer class's methods (`trainer = Trainer(model, optimizer,
      criterion, device)`, then `trainer.fit(train_loader, val_loader,
      epochs)` calling `self.train_epoch(loader)`): they receive the
      accelerator as those functions do, and what the instance keeps
      (`self.model = model.to(device)`, `self.optimizer = optimizer`) is
      prepared under the names the entry point makes it with;
    - a training loop in another module of the project that the script
      hands its model, optimizer and training DataLoader (`from engine
      import train_fn`, `train_fn(train_loader, model, optimizer, device)`;
      codemods/_accelerate/handed.py, received.py): the script prepares
      them and passes `accelerator=accelerator`, the loop's function takes
      the parameter and its code is migrated as the entry point's own
      (backward, clipping, printing, saves, running totals); the two files
      are written together, or neither when either is refused (two handed
      loops in one module, a GradScaler the script hands the loop, a
      criterion built in the script that sums over the batch); the loop's
      CUDA autocast and GradScaler become the script's Accelerator's mixed
      precision; a loop function that hands its loader on to a per-epoch
      step (`train` -> `train_step(dataloader=train_dataloader, ...)`)
      passes the accelerator to it, and the step's running totals are
      combined there; a training DataLoader that a function of another
      module builds and returns (`train_dataloader, test_dataloader, names
      = data_setup.create_dataloaders(...)`) is prepared where the script
      receives it, its batches dispatched from the main process (AM810:
      whether it shuffles is not seen from the script); so is one that the
      script's own training loop iterates (`dataloader = get_celeba(params)`);
    - a call of another module's function that writes a file (`utils.save_model(model=model, ...)`),
      on a line of its own in the entry point: under `if
      accelerator.is_main_process:`, given `accelerator.unwrap_model(model)`
      (AM808); an instance of such a class (an early stopper that saves the
      best weights) is refused (AM826);
    - the trained models, their optimizers, the training DataLoaders and the
      entry point's schedulers passed through `accelerator.prepare(...)` once
      they are all made; a training DataLoader made anew at the top of each
      epoch (`for epoch ...: loader = DataLoader(...)`) is prepared right
      where it is made, each time (fabric refuses it: set up anew, its
      sampler would draw one order for every epoch);
    - the training loop's tensors shaped with the loader's batch size
      (`x.view(batch_size, -1)`, `torch.zeros(batch_size, 1)`): each
      process holds its share of every batch, so the size reads
      `batch_size // accelerator.num_processes` (AM832);
    - an evaluation loop that reads whole (AM813; codemods/_accelerate/metrics.py):
      `for x, y in test_loader` (or `enumerate(...)`) over an unshuffled
      loader of the entry point, in the entry point or a flat script's
      function, moving the batch to the device, then `out = model(x)` of the
      prepared model in eval mode: the loader is prepared too and
      `out, y = accelerator.gather_for_metrics((out, y))` follows the
      forward, so each process evaluates its slice and the metrics read the
      original's batches (the last one's padding dropped). Other evaluation
      loaders stay whole (every process evaluates the full set, and the
      numbers printed are one process's);
    - `device = torch.device(...)` (or `args.device = torch.device(...)`, or
      `self.device = ...` in a trainer's method) -> `device = accelerator.device` (a string
      device's `device == "cuda"` -> `device.type == "cuda"`), and
      `.cuda()` / `.to("cuda")` -> `.to(accelerator.device)`; a `--gpu N`
      read only by `torch.cuda.set_device(args.gpu)` (dropped) and
      `.cuda(args.gpu)` (-> `.to(accelerator.device)`) stays, unread;
    - `loss.backward()` -> `accelerator.backward(loss)` (times
      `accelerator.num_processes` for a loss summed over the batch: DDP
      averages the processes' gradients); `clip_grad_norm_` /
      `clip_grad_value_` -> `accelerator.clip_grad_norm_` / `clip_grad_value_`;
    - `nn.DataParallel(model)` -> `model`; a line `model = nn.DataParallel(model)`
      goes, with the `if torch.cuda.device_count() > 1:` it is alone under;
    - CUDA mixed precision (`torch.cuda.amp.autocast()`, `torch.autocast("cuda")`,
      `torch.amp.autocast("cuda", dtype=...)`, with or without a GradScaler)
      -> `Accelerator(mixed_precision="fp16" if torch.cuda.is_available()
      else "no")` ("bf16" for a bf16 autocast) (AM812): the autocast blocks
      give way to their body (accelerate autocasts the prepared model's
      forward), `scaler.scale(loss).backward()` -> `accelerator.backward(loss)`,
      `scaler.step(opt)` -> `opt.step()`, `scaler.update()` and
      `scaler.unscale_(opt)` removed (`accelerator.clip_grad_norm_`
      unscales). Without CUDA the original's CUDA autocast was off, so "no"
      keeps its fp32 numbers there;
    - NVIDIA apex's amp onto the same setting (AM812): `amp.initialize(...)`
      at opt_level "O1" or "O2" removed (O2 is told that Accelerate's fp16 is
      autocast over fp32 weights, O1's), "O0" -> no mixed precision;
      `with amp.scale_loss(loss, opt) as scaled: scaled.backward()` ->
      `accelerator.backward(loss)`; `amp.master_params(opt)` -> the
      optimizer's own parameters; the apex import removed;
    - `print` -> `accelerator.print`; `torch.save(...)` and `open(..., "w")`
      blocks under `if accelerator.is_main_process:`, `torch.save` through
      `accelerator.save`; `model.state_dict()`, `model.load_state_dict(...)`,
      `model.module` and the model's own attributes outside the training loop
      through `accelerator.unwrap_model(model)`, so checkpoint keys carry no
      `module.`;
    - a random draw sized by the step's batch in a loop that trains (a GAN's
      noise: `torch.randn(b_size, nz, ...)` with `b_size = real.size(0)`,
      `x.shape[0]` or `len(x)`) (AM815; codemods/_accelerate/draws.py):
      every process is seeded alike, so each draws the original's noise for
      the global batch, `torch.randn(b_size * accelerator.num_processes, nz,
      ...)`, and keeps the rows of its own samples,
      `.split(b_size)[accelerator.process_index]` (`split_batches` gives
      process i those rows of every batch); in a world of one, the
      original's draw; exact where every global batch splits evenly (AM811).
      A trained model with dropout, or such noise with a shuffled loader
      (the main process alone draws its order from the global RNG), is
      noted (AM816): a seeded run trains as well, not to the same numbers;
      so is BatchNorm, whose statistics each process computes on its slice (AM817).

    Data order: a seeded script computes the original's numbers on N
    processes, shuffled or not. An unshuffled loader is read by every
    process, each keeping its slice. A shuffled one (or one with its own
    sampler) gets `dispatch_batches=True` (AM810): on N processes `prepare`
    would give its RandomSampler a generator of its own, drawn from the
    global RNG, whatever `rng_types` or `use_seedable_sampler` say, and so
    another order; dispatched, the loader stays untouched on rank 0, which
    draws the original's order and sends each process its slice of every
    batch (the batches must be tensors). In a world of one nothing changes.

Why
    Accelerate runs one script on a CPU, GPUs, DeepSpeed or FSDP from a
    config file; moving a script onto it by hand is easy to get subtly wrong
    (a batch that silently doubles, processes that never join).

Example
    Before::

        def main():
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            loader = DataLoader(train_set, batch_size=32)
            model = nn.DataParallel(Net()).to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(10):
                for x, y in loader:
                    x, y = x.to(device), y.to(device)
                    optimizer.zero_grad()
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
                print(f"epoch {epoch}")
            torch.save(model.state_dict(), "model.pt")

    After::

        def main():
            accelerator = Accelerator()
            device = accelerator.device
            loader = DataLoader(train_set, batch_size=32)
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for epoch in range(10):
                for x, y in loader:
                    optimizer.zero_grad()
                    loss = criterion(model(x), y)
                    accelerator.backward(loss)
                    optimizer.step()
                accelerator.print(f"epoch {epoch}")
            if accelerator.is_main_process:
                accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")

Left alone (a finding says what to do by hand; nothing changes)
    Scripts already distributed or on Accelerate (AM822); CPU autocast,
    autocast with `enabled=` or a dtype not written as torch.float16 /
    bfloat16, a GradScaler with settings or used beyond
    scale/step/update/unscale_ (saved in a checkpoint: Accelerate's own is
    saved by `accelerator.save_state`), apex at O3, with an opt_level or
    `enabled=` that is not a literal, under a condition (`if args.fp16:`),
    imported under `try:`, saved in a checkpoint (`amp.state_dict()`) or
    beyond amp (apex.parallel, apex.optimizers) (AM821); training steps in methods of a
    class whose instances or calls cannot be followed (a model's own methods,
    a class named other than to make an instance, an instance made before
    what it keeps is all made), in functions
    called from elsewhere than the entry point or with other objects at
    different calls, models, optimizers or loaders made in or after the training
    loop or under a dotted name (AM820); devices chosen elsewhere, `.cuda()`
    outside the entry point, GPU selection, a `--device` / `--gpu` flag read
    past those lines, and, in a script that places nothing on a device, an
    evaluation forward of the model (under no_grad, over a loader left as it
    is, or in the entry point after training) on data no prepared loader
    yields, which would stay on the CPU while the model runs on the GPU
    (AM827); backward with arguments
    or `torch.autograd.backward` (AM828); losses of unclear reduction (AM823);
    a model's own attributes outside the entry point or its methods in the
    training loop (AM824); writes and prints outside the entry point, or a
    file read back after the main process alone writes it (AM826); training
    loaders with a batch of one or a `**kwargs` dict whose keys cannot be seen (AM829); names the
    migrated code needs already used (AM825); a loop that trains left on
    a value each process computes for itself (AM830); other random draws in a loop that
    trains (one of a fixed size, `torch.randint`, `torch.randn_like`, a size
    read elsewhere), alike on every process (AM831).
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from ._accelerate.common import CannotMigrate, Plan, on_main_process
from ._accelerate.plan import Planner
from ._accelerate.received import ReceivedPlanner
from ._base import Codemod
from ._options import exact_parity
from .script import project_facts
from .script.project_facts import NO_FACTS


class AccelerateCodemod(Codemod):
    word = "accelerate"
    # Accelerate places the model and the batches, runs mixed precision and
    # shards the data itself; the plain words would write the tool's own
    # helpers for the same (which it then refuses to migrate, AM822).
    excludes = ("workers", "device", "amp", "ddp", "fsdp", "fabric")
    plans_in_visit_module = True
    summary = "a plain or DataParallel script -> Hugging Face Accelerate (prepare, backward, main-process output)"
    requires = ()
    codes = {
        "AM801": "script without an Accelerator",
        "AM802": "model, optimizer and training DataLoader not prepared by Accelerate",
        "AM803": "device chosen by the script, not by Accelerate",
        "AM804": "backward outside accelerator.backward",
        "AM805": "gradient clipping outside accelerator.clip_grad_norm_",
        "AM806": "DataParallel: one process drives every GPU",
        "AM807": "printing on every process",
        "AM808": "checkpoint or file written on every process",
        "AM809": "use of the model that needs the bare module (state_dict, its own attributes)",
        "AM810": "shuffled training DataLoader: the main process draws the order and sends each process its slice",
        "AM811": "last partial batch completed with the epoch's first samples on N processes",
        "AM812": "mixed precision (torch autocast, GradScaler, apex amp) moved onto Accelerator(mixed_precision=...)",
        "AM813": "evaluation DataLoader sharded; metrics from accelerator.gather_for_metrics",
        # AM814 is left free: the fabric codemod's AM914 (an odd batch size) is its own.
        "AM815": "random draw sized by the batch in a loop that trains, alike on every process (a GAN's noise)",
        "AM816": "random numbers that on N processes are not the original's (dropout masks, noise behind a shuffled loader)",
        "AM817": "BatchNorm statistics computed on each process's slice of the batch",
        "AM820": "training loop, entry point or trained objects that cannot be prepared",
        "AM821": "mixed precision that accelerate does not migrate",
        "AM822": "script already distributed or on Accelerate",
        "AM823": "loss whose reduction over the batch cannot be read",
        "AM824": "model used through its own attributes where DDP's wrapper hides them",
        "AM825": "name needed by the migrated code already used",
        "AM826": "output that cannot be moved to the main process safely",
        "AM827": "device placement that cannot be given to Accelerate",
        "AM828": "backward that accelerator.backward cannot take as written",
        "AM829": "training DataLoader that the processes cannot split",
        "AM830": "loop exit decided on each process's own value",
        "AM831": "random draw in a loop that trains, alike on every process (a GAN's noise)",
        "AM832": "global batch size shaping this process's share of the batch",
        "AM833": "running total of a training loop read after it: one process's share of the one-process total",
        "AM834": "Accelerate's defaults: on N processes the global batch is N times the DataLoader's (accelerate=parity keeps the original's)",
        "AM835": "shuffled training DataLoader: on N processes Accelerate's sampler draws another order (accelerate=parity keeps the original's)",
        "AM836": "learning-rate scheduler stepped per epoch, left out of prepare (Accelerate's would step it once per process)",
    }
    notes = frozenset({"AM811", "AM816", "AM817", "AM822", "AM834", "AM835", "AM836"})
    triggers = ("backward",)
    # A training loop in another module of the project, handed what a script builds, is migrated in both files
    # (codemods/_accelerate/handed.py, received.py).
    reads_handoffs = True
    own_planner, received_planner = Planner, ReceivedPlanner

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.parity = exact_parity(self.word, self.options)
        self._plan = Plan()

    def planner(self) -> Planner | None:
        """This file's planner: for a loop that the project's scripts hand their model (received.py), or for the
        file's own training; None where the project pairs the file with another only for what another word
        does there (a loader built here for ddp)."""
        facts = project_facts.current() if self.reads_handoffs else NO_FACTS
        if facts.pairs and not (facts.received_loops or facts.training_loops or self.script.training_steps):
            return None
        return (self.received_planner if facts.received_loops else self.own_planner)(self)

    def visit_Module(self, node: cst.Module) -> bool:
        planner = self.planner()
        if planner is None:
            return True
        try:
            plan = planner.make()
        except CannotMigrate as failure:
            self.report(failure.node, failure.code, failure.message)
            return True
        # All or nothing: a suppressed core step would leave a half migration.
        if any(self.is_suppressed(n, c) for n, c, _ in plan.fixes if c in ("AM801", "AM802", "AM804")):
            return True
        for fix in plan.fixes:
            self.fix(*fix)
        for note in plan.notes:
            self.report(*note)
        for module, name in plan.imports:
            self.add_import(module, name)
        self._plan = plan
        return True

    def on_leave(self, original_node, updated_node):
        updated_node = super().on_leave(original_node, updated_node)
        edit = self._plan.edits.get(original_node)
        if edit is not None and not isinstance(updated_node, cst.RemovalSentinel):
            updated_node = edit(updated_node)
        return updated_node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._rewrite_body(original_node.body, updated_node.body))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._rewrite_body(original_node.body, updated_node.body))

    def _rewrite_body(self, originals: Sequence[cst.CSTNode], updated: Sequence[cst.CSTNode]) -> list:
        plan = self._plan
        result: list = []
        run_open = False  # the last statement written is a main-process block that may take the next write
        for original, statement in zip(originals, updated):
            if original in plan.removed:
                # What is planned around a removed line stays (`prepare` after apex's `amp.initialize`).
                result.extend(plan.before.get(original, ()))
                result.extend(plan.after.get(original, ()))
                continue
            if original in plan.unwrapped:
                # An autocast block: its body, one level up, under the block's comments.
                inner = list(statement.body.body)
                result.extend(plan.before.get(original, ()))
                result.append(inner[0].with_changes(leading_lines=[*statement.leading_lines, *inner[0].leading_lines]))
                result.extend(inner[1:])
                result.extend(plan.after.get(original, ()))
                run_open = False
                continue
            inserted = plan.before.get(original, ())
            if inserted:
                run_open = False
                # The new lines go between the statement's comments and the statement.
                result.append(inserted[0].with_changes(leading_lines=statement.leading_lines))
                result.extend(inserted[1:])
                statement = statement.with_changes(leading_lines=[])
            if original in plan.guarded:
                if run_open and not statement.leading_lines:
                    # One block for consecutive writes.
                    result[-1] = result[-1].with_changes(body=result[-1].body.with_changes(body=[*result[-1].body.body, statement]))
                    result.extend(plan.after.get(original, ()))
                    continue
                statement = on_main_process([statement], statement)
            result.append(statement)
            run_open = original in plan.guarded and not plan.after.get(original)
            result.extend(plan.after.get(original, ()))
        return result
