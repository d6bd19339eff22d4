"""fabric: a plain PyTorch training script -> Lightning Fabric.

What it does
    Moves a script that trains in one process (with or without
    `nn.DataParallel`) onto `lightning_fabric.Fabric`, so that the same file
    runs on a CPU, one GPU, or many processes under torchrun, and computes
    what the original computed. It reads the script as the accelerate
    codemod does (the same training steps, entry point, devices and outputs,
    and the same refusals), and writes Fabric's calls. By default as
    Fabric's guide writes them: `Fabric()` (with `precision=` where the
    script used mixed precision) and `fabric.launch()`, the devices and
    nodes left to `fabric run` (LT_DEVICES, LT_NUM_NODES), each process
    loading the loader's batch size (note AM934: the original with N times
    larger batches), the set-up model's and batches' `.to(device)` dropped.
    `fabric=parity` writes the exact form below:

    - one `Fabric` made and launched at the start of the entry point (the
      function the `__main__` block calls, or a flat script's first code):
      `accelerator="cuda" if torch.cuda.is_available() else "cpu"`,
      `devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1))` and
      `num_nodes=int(os.environ.get("WORLD_SIZE", 1)) // devices`. Under
      torchrun Fabric's TorchElasticEnvironment requires devices * num_nodes
      to be WORLD_SIZE (and picks DDP, gloo on a CPU); plain `python` sets
      neither variable: a world of one, no variable for the user to set;
    - `model, optimizer = fabric.setup(model, optimizer)` once the trained
      objects are made (one setup per model, with the optimizers of the
      steps that train it) and `loader = fabric.setup_dataloaders(loader)`
      for the training loaders; evaluation loaders stay whole (every process
      evaluates the full set, so the numbers printed are one process's);
    - a trainer class's methods, as accelerate does them (`trainer.fit(...,
      fabric=fabric)`, what the instance keeps set up under the names the
      entry point makes it with);
    - a training loop in another module of the project that the script
      hands its model, optimizer and training DataLoader, as accelerate
      does it (codemods/_fabric/received.py): the script sets them up and
      passes `fabric=fabric`, the loop's function takes `fabric` and its
      backward, printing, saves and running totals go through it (a
      gradient clip there is refused: Fabric clips an optimizer's
      parameters, which that module cannot pair with a model; a training
      DataLoader that another module builds and returns is refused, AM929:
      each process's share of its batch would be set there); a helper of
      another module that writes a file runs under `if fabric.is_global_zero:`;
    - each training loader's `batch_size=B` -> `B // fabric.world_size`
      (AM913): Fabric gives it a DistributedSampler that shares the data set
      out among the processes, so the global batch stays B, and with an
      unshuffled loader each step trains on the original's samples (rank r
      takes every world-size-th of them). A batch size known to be odd is
      noted (AM914);
    - `device = torch.device(...)` -> `device = fabric.device`, and
      `.cuda()` / `.to("cuda")` -> `.to(fabric.device)`;
    - `loss.backward()` -> `fabric.backward(loss)` (times `fabric.world_size`
      for a loss summed over the batch: DDP averages the processes'
      gradients); `clip_grad_norm_(model.parameters(), c)` ->
      `fabric.clip_gradients(model, optimizer, max_norm=c,
      error_if_nonfinite=False)` (Fabric clips the optimizer's parameters:
      the optimizer must be the one made from `model.parameters()`), and
      `clip_grad_value_` -> `clip_val=`;
    - `nn.DataParallel(model)` -> `model`, and `model.module` -> `model`:
      Fabric's module answers `state_dict()` with the bare module's keys
      (no `module.`) and hands over the model's own attributes;
    - CUDA mixed precision (autocast blocks, with or without a GradScaler)
      -> `Fabric(precision="16-mixed" if torch.cuda.is_available() else
      "32-true")` ("bf16-mixed" for a bf16 autocast) (AM912): the blocks give
      way to their body (the set-up model's forward autocasts),
      `scaler.scale(loss).backward()` -> `fabric.backward(loss)`,
      `scaler.step(opt)` -> `opt.step()`, `scaler.update()` and
      `scaler.unscale_(opt)` removed (`fabric.clip_gradients` unscales);
    - a random draw sized by the step's batch in a loop that trains (a GAN's
      noise, `torch.randn(b_size, nz)` with `b_size = real.size(0)`) (AM915):
      every process draws the original's noise for the global batch,
      `torch.randn(b_size * fabric.world_size, nz)`, and keeps its own
      samples' rows, `[fabric.global_rank::fabric.world_size]` (the
      DistributedSampler's share); exact where every global batch splits
      evenly (AM911). A trained model with dropout is noted (AM916): each
      process draws its own masks; so is BatchNorm, whose statistics each
      process computes on its share (AM917);
    - `print` -> `fabric.print` (local rank 0: once on each machine);
      `torch.save(...)` and `open(..., "w")` blocks under
      `if fabric.is_global_zero:`.

    Data order: unshuffled, N processes train on the original's batches. A
    shuffled training loader (or one with a sampler) keeps its order in a
    world of one; on N processes Fabric's DistributedSampler draws its own
    (seeded with 0 and the epoch, AM910): a seeded run trains as well, not
    to the same numbers. Fabric offers no way to keep the original's order
    that the migrated script could use without code of its own.

Why
    Fabric runs one script on a CPU, GPUs or many nodes with Lightning's
    strategies and precisions, without moving it into a LightningModule; the
    move by hand is easy to get subtly wrong (a global batch that silently
    doubles, a checkpoint written by every process).

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
            torch.save(model.module.state_dict(), "model.pt")

    After::

        def main():
            fabric = Fabric(accelerator="cuda" if torch.cuda.is_available() else "cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)), num_nodes=int(os.environ.get("WORLD_SIZE", 1)) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
            fabric.launch()
            device = fabric.device
            loader = DataLoader(train_set, batch_size=32 // fabric.world_size)
            model = Net().to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model, optimizer = fabric.setup(model, optimizer)
            loader = fabric.setup_dataloaders(loader)
            for epoch in range(10):
                for x, y in loader:
                    x, y = x.to(device), y.to(device)
                    optimizer.zero_grad()
                    loss = criterion(model(x), y)
                    fabric.backward(loss)
                    optimizer.step()
                fabric.print(f"epoch {epoch}")
            if fabric.is_global_zero:
                torch.save(model.state_dict(), "model.pt")

Left alone (a finding says what to do by hand; nothing changes)
    What the accelerate codemod leaves alone, in Fabric's words: scripts
    already distributed, on Accelerate or on Lightning (AM922); mixed
    precision it cannot read (CPU autocast, `enabled=`, a scaler with
    settings or saved, apex: AM921); training steps outside the function
    the `__main__` block calls, trained objects made in the loop or under a
    dotted name, an optimizer stepping for two models (AM920); devices
    chosen elsewhere, GPU selection (AM927); backward with arguments
    (AM928); losses of unclear reduction (AM923); the model's own methods
    called while training or outside the entry point (AM924); writes and
    prints outside the entry point, a file read back after the main process
    alone writes it (AM926); training loaders with a batch of one, unseen
    arguments, a batch_sampler or an IterableDataset of the
    file, which Fabric gives no sampler (AM929); names the migrated code needs
    already used (AM925); loop exits each process decides alone (AM930);
    other random draws in a loop that trains (one of a fixed size), alike on
    every process (AM931);
    clipping of parameters that are not one model's with its one optimizer
    (AM905).
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from ._accelerate.common import CannotMigrate
from ._fabric.common import (
    fabric_code,
    fabric_words,
    in_fabric_names,
    is_accelerator_call,
)
from ._fabric.plan import FabricPlanner
from ._fabric.received import ReceivedFabricPlanner
from .accelerate import AccelerateCodemod


def _keeping_saves(edit):
    """The accelerate planner's edit in Fabric's names, but a `torch.save(...)` stays itself (guarded by the main
    process)."""
    return lambda updated: updated if is_accelerator_call(result := edit(updated), "save") else in_fabric_names(result)


class FabricCodemod(AccelerateCodemod):
    word = "fabric"
    excludes = ("workers", "device", "amp", "ddp", "fsdp", "accelerate")  # as accelerate's (AM922)
    summary = "a plain or DataParallel script -> Lightning Fabric (setup, setup_dataloaders, backward, rank-zero output)"
    own_planner, received_planner = FabricPlanner, ReceivedFabricPlanner
    codes = {
        "AM901": "script without a Fabric object",
        "AM902": "model, optimizer and training DataLoader not set up by Fabric",
        "AM903": "device chosen by the script, not by Fabric",
        "AM904": "backward outside fabric.backward",
        "AM905": "gradient clipping outside fabric.clip_gradients",
        "AM906": "DataParallel: one process drives every GPU",
        "AM907": "printing on every process",
        "AM908": "checkpoint or file written on every process",
        "AM909": "DataParallel's `.module`, which the model Fabric sets up answers itself",
        "AM910": "shuffled training DataLoader: on N processes Fabric's DistributedSampler draws another order",
        "AM911": "data set or last batch that the processes share out unevenly",
        "AM912": "mixed precision moved onto Fabric(precision=...)",
        "AM913": "training batch size divided among the processes (the global batch kept)",
        "AM914": "batch size that the processes cannot split evenly",
        "AM915": "random draw sized by the batch in a loop that trains, alike on every process (a GAN's noise)",
        "AM916": "random numbers that on N processes are not the original's (dropout masks)",
        "AM917": "BatchNorm statistics computed on each process's share of the batch",
        "AM920": "training loop, entry point or trained objects that cannot be set up",
        "AM921": "mixed precision that fabric does not migrate",
        "AM922": "script already distributed, on Accelerate or on Lightning",
        "AM923": "loss whose reduction over the batch cannot be read",
        "AM924": "model trained through its own methods, which skip DDP's synchronisation",
        "AM925": "name needed by the migrated code already used",
        "AM926": "output that cannot be moved to the main process safely",
        "AM927": "device placement that cannot be given to Fabric",
        "AM928": "backward that fabric.backward cannot take as written",
        "AM929": "training DataLoader that the processes cannot share out",
        "AM930": "loop exit decided on each process's own value",
        "AM931": "random draw in a loop that trains, alike on every process (a GAN's noise)",
        "AM932": "global batch size shaping this process's share of the batch",
        "AM933": "running total of a training loop read after it: one process's share of the one-process total",
        "AM934": "Fabric's defaults: on N processes the global batch is N times the DataLoader's (fabric=parity keeps the original's)",
    }
    notes = frozenset({"AM910", "AM911", "AM914", "AM916", "AM917", "AM922", "AM934"})
    triggers = ("backward",)

    def is_suppressed(self, node: cst.CSTNode, code: str) -> bool:
        # The accelerate planner asks with its own codes.
        return super().is_suppressed(node, fabric_code(code))

    def visit_Module(self, node: cst.Module) -> bool:
        planner = self.planner()
        if planner is None:
            return True
        try:
            plan = planner.make()
        except CannotMigrate as failure:
            self.report(failure.node, fabric_code(failure.code), fabric_words(failure.message))
            return True
        plan.fixes = [(n, fabric_code(c), fabric_words(m)) for n, c, m in plan.fixes]
        plan.notes = [(n, fabric_code(c), fabric_words(m)) for n, c, m in plan.notes]
        # All or nothing: a suppressed core step would leave a half migration.
        if any(self.is_suppressed(n, c) for n, c, _ in plan.fixes if c in ("AM901", "AM902", "AM904")):
            return True
        plan.edits = {n: _keeping_saves(edit) for n, edit in plan.edits.items()}
        for fix in plan.fixes:
            self.fix(*fix)
        for note in plan.notes:
            self.report(*note)
        for module, name in plan.imports:
            self.add_import(module, name)
        self._plan = plan
        return True

    def _rewrite_body(self, originals: Sequence[cst.CSTNode], updated: Sequence[cst.CSTNode]) -> list:
        # What the accelerate rewrite builds (`if accelerator.is_main_process:`, the edits), in Fabric's names;
        # the script's own statements hold no `accelerator` (AM925).
        kept = {id(s) for s in updated}
        return [s if id(s) in kept else in_fabric_names(s) for s in super()._rewrite_body(originals, updated)]
