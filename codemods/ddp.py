"""ddp: one process (with or without `nn.DataParallel`) -> DistributedDataParallel.

What it does
    Turns a script that trains in one process, with `nn.DataParallel` or on
    one device, into one that trains in as many processes as it is launched
    with (`accelmigrate run`, torchrun, SLURM tasks), and that still behaves
    as before when started with plain `python train.py` (a world of one):

    - joins the process group at the start of the entry point
      (`init_distributed()`: torchrun's or SLURM's environment, nccl on CUDA
      and gloo on CPU, the rank's GPU made current; torn down at exit,
      after an exception too; a world of one joins nothing);
    - wraps each trained model in `DistributedDataParallel` once it is on
      its device (after apex's `amp.initialize`, which must see the bare
      model): in place of `nn.DataParallel`, or else each model whose
      parameters an optimizer (or a hand-written `p.data.add_(p.grad, ...)`
      update) trains: a GAN's generator and discriminator, an actor and a
      critic, a distilled student (its frozen teacher stays bare, and loses
      its DataParallel, as does a second model that only reloads a checkpoint
      for inference), at the binding that training calls (an optimizer built
      in a factory from its parameter gets the model wrapped where the
      factory is called; so does one built by the model's own method,
      nanoGPT's `optimizer = model.configure_optimizers(...)` over param
      groups of its named parameters, or by a factory given
      `model.parameters()`) (only when there is a process group, so a world of
      one runs the bare model). The wrap comes after the model's last move
      (`model.cuda()` after the optimizer is made, `if args.cuda:
      net = nn.DataParallel(net); net.cuda()`, whose move keeps its
      condition): `.cuda()`/`.to()` move a module's parameters in place, so
      the optimizer already holds the ones DDP wraps. Where several models train and one of them
      is called more than once per step (a discriminator on real and fake
      batches), that one gets `**rank_local_buffers()`: DDP would otherwise
      overwrite its BatchNorm statistics in place between forwards that
      autograd still needs; each rank keeps its own statistics, the
      parameters stay equal. A model whose `forward` (in this file) calls a
      layer only under a condition, or returns several outputs of which a
      training call uses only some (an InfoGAN discriminator's heads:
      `validity, _ = netD(fake)`), gets `find_unused_parameters=True`.
      Where the optimizer takes one name of the model and training calls
      another (`model = net`, `net(xb)`), the wrap goes under the name the
      forward is called through, after the other names are bound (they keep
      the bare module; the optimizer steps the same parameters); a forward
      called through two names is refused. A function of another module
      given the model (`evaluate(model, val_loader)`) gets the bare module
      (it may read `model.n_classes`), unless it may train through it (an
      optimizer given along, or a result a backward's loss is computed from).
      A model whose loss sums over the batch (`reduction="sum"`, `.sum()`;
      read by `codemods/script/reduction.py`) gets
      `sum_gradients_across_ranks(model)` right after the wrap: a
      communication hook that adds the ranks' gradients up where DDP would
      average them (each rank's sum is over its share of the global batch,
      so the sum is the original's gradient; the average would be 1/world of
      it). A hook rather than `loss * world_size()`: the loss the script
      logs and the code around `backward()` stay as written. Under
      `ddp=per-process` the average is kept: with the learning rate scaled by
      the world size, it already gives the original's step per sample;
    - makes a loop that trains leave on rank 0's decision
      (`if rank_zero_decides(loss.item() < target): break`, early stopping,
      a `while` test) wherever the condition may differ between ranks: a
      rank leaving alone would leave the others waiting in an all-reduce;
      an exit nested in the branches of other tests (a patience counter in
      the `else:` of the improvement test) gets each test on its way
      decided too, outermost first, so every rank reaches the exit alike;
    - gives each training DataLoader a `SeededDistributedSampler` (the
      runtime's DistributedSampler) that carries its old `shuffle=` (and
      `generator=`): in a world of one it shuffles exactly as `shuffle=True`
      did, from the script's own `torch.manual_seed(...)`; across ranks its
      seed is rank 0's draw from that same seeding. Calls
      `<loader>.sampler.set_epoch(epoch)` at the top of the epoch loop, and
      divides the batch size by the world size, so that the global batch,
      the steps per epoch and the learning-rate schedule stay what they were
      (`--to ddp=per-process` keeps the batch per process instead, so the
      global batch grows with the world size, and scales the optimizers'
      learning rates linearly). Where the loop that trains shapes tensors
      with the loader's batch size (`images.reshape(batch_size, -1)`,
      `torch.ones(batch_size, 1)`, `range(batch_size)`), those sizes read
      `per_process_batch_size(batch_size)`; its other uses (steps per epoch)
      keep the global batch. A batch size known to be odd (a literal, a
      constant, an argparse default of 1) gets a finding: no even number of
      processes can split it;
      a DataLoader given its arguments as a dict (`DataLoader(dataset,
      **train_kwargs)`, built and `.update()`d as the classic examples do)
      gets `**sharded_loader_kwargs(dataset, train_kwargs)`: the dict as it is
      at run time, nothing lost, with the sampler in place of its `shuffle=`
      and its batch size split. A loader a trainer class keeps
      (`self.train_loader = train_loader` in `__init__`) is found where a
      method iterates it, and set_epoch goes into the epoch loop of the
      method that calls that one. A loader that a function of another
      module of the project builds and returns to the script's own
      training loop (`dataloader = get_celeba(params)`) gets its sampler
      and per-process batch size there, and the script's epoch loop
      `set_loader_epoch(dataloader, epoch)`;
    - where no DataLoader feeds training, gives each rank its share of the
      batch the step draws itself (slices of a data set tensor in a range
      loop, `X[i:i + B]`; whole tensors every step; what a function of the
      file returns, `inp, target = get_batch()`), found from the loss back
      through the step's assignments, the model's and the criterion's
      arguments: `rank_share(X[i:i + B])`, the rows `rank, rank + world,
      ...` as DistributedSampler would give them, together the original's
      batch. A batch the processes cannot split evenly goes whole to every
      rank (the mean over unequal shares is not the batch's mean); a loss
      summed over the batch takes unequal shares (`summed=True`), whose
      gradients `sum_gradients_across_ranks` adds up. A state the model's
      own method makes for the batch (`model.init_hidden(8)`) is sized
      `per_process_batch_size(8)`. Left whole, with a finding, where any of
      it cannot be read: a random draw, a tensor of a fixed size or an
      outside tensor in arithmetic in the step, a loop's item, a recurrent
      or attention layer without `batch_first=True` (its batch is not the
      first dimension), an RL agent's environment or replay buffer (each
      rank would step its own environment);
    - gives each rank its own share of the random draws sized by the batch
      in a loop that trains (a GAN's noise, `torch.randn(batch, latent)`
      with `batch = real.size(0)` or the loader's batch size; `torch.rand`
      too): every rank is seeded alike, so each would draw the same noise
      and the global batch of fakes would hold every sample once per rank.
      `draw_rank_share(torch.randn, batch, latent)` draws the original's
      noise for the whole batch on every rank (their generators stay in
      step: the sampler draws its order alike on every rank) and keeps this
      rank's rows, `rank, rank + world, ...`, those of the samples the
      sampler gives this rank: together the ranks draw exactly the
      original's noise, and a world of one draws `torch.randn(batch, latent)`
      itself. A draw of a fixed size (`torch.randn(64, latent)` for samples)
      stays: alike on every rank, it is the original's draw, and so are the
      gradients averaged across the ranks;
    - prints, logs and writes files (`torch.save`, `open(..., "w")`, ...) on
      rank 0 only and hides tqdm bars on the other ranks; where every rank
      then reads back (`torch.load`, `open`, `numpy.load`) or removes
      (`os.remove`) a file rank 0 writes earlier in the same function,
      a `barrier()` comes first, and the removal is rank 0's; a read in a
      loop of a file rank 0 writes later in the loop (a checkpoint saved at
      the end of an epoch, loaded at the start of the next) gets a
      `barrier()` right after the write; copying, moving or replacing a file
      that rank 0 alone wrote (`shutil.copyfile(filename,
      "model_best.pth.tar")` under `if is_best:`) is rank 0's as well;
    - writes TensorBoard events, wandb runs and CSV logs once (AM528): a
      `SummaryWriter` (torch's or tensorboardX's, at module level, in main
      or as `self.writer`) is made on rank 0 only, the others hold a
      `NullWriter` whose methods write nothing, so every line that logs
      still runs on every rank (a value needing a collective is computed as
      before); `wandb.init(...)` gets `mode=... if is_main_process() else
      "disabled"`; a file opened for writing that cannot go under the guard
      (`log = open(path, "w")` for a `csv.writer`, a `with open(...)` around
      the training loop) is opened as `os.devnull` on the other ranks;
    - makes folders that every rank creates at once safe (AM537): under
      `if not os.path.exists(d):` the call becomes `os.makedirs(d,
      exist_ok=True)` (the folder is missing there in a world of one; a
      missing parent is made where `os.mkdir` failed); a folder made
      without a check (it must not exist yet) is made on rank 0, then
      every rank waits at a `barrier()`;
    - notes a trained model built here with BatchNorm layers (AM538): each
      process computes their statistics on its own share of the batch;
      `--to sync-bn` shares them across processes (GPUs); and a model that
      draws random numbers while it trains (dropout, noise in its forward)
      or a step that draws them itself (numpy noise), in the loop or in a
      function of the file the step calls (a gradient penalty's weights)
      (AM535): each process draws its own for its share of the batch, so a
      seeded run trains as well as the original but not to the same
      numbers; and a training DataLoader without `drop_last=True` (AM536):
      a data set the number of processes does not divide is padded with
      its first samples, and a last partial batch is shared out unevenly,
      each rank averaging its own share;
    - reads and writes `state_dict`s (and `.module`) through
      `unwrap_model(model)`, so checkpoint keys carry no `module.` prefix;
      so do the model's own methods and attributes outside training
      (`model.decode(z)` when sampling, `model.latent_dim`, `model.layer4`
      for a hook), and in training those that compute nothing from the
      parameters (an RNN's `init_hidden()`: zeros of a parameter's dtype)
      or whose result is detached where it is made (`model.encoder(x)
      .detach().cpu().numpy()` for a metric); a method that only returns
      `self(x)` becomes a call of the wrapper (`model.predict(x)` ->
      `model(x)`); `model[0]`, and tools that trace or inspect the module
      (`writer.add_graph(model, ...)`, torchinfo's `summary(model)`);
    - combines the running totals of a loop that trains across the ranks
      right after it (AM514): each rank adds up only its share of every
      batch, so `print(running_loss / len(loader.dataset))` after the loop
      would print a world-size fraction of the epoch's loss; sums and counts
      (`loss.item() * x.size(0)`, `(pred == y).sum().item()`, `y.size(0)`)
      become `sum_across_ranks(...)`, per-batch means (`loss.item()` of a
      criterion's mean) `average_across_ranks(...)`: the one-process totals,
      on every rank (codemods/_ddp/rank_totals.py);
    - gives `--local_rank` / `--local-rank` a default read from LOCAL_RANK,
      where torchrun puts it;
    - migrates a training loop of another module of the project together
      with the script that hands it the model and the loader
      (`train_one_epoch(model, train_loader, optimizer, criterion, device)`
      from `engine.py`): the model is wrapped and the DataLoader sharded in
      the script, where they are built, `set_epoch` goes around the call;
      in the loop's module the model parameter is the wrapped model
      (`unwrap_model(model).state_dict()`), an epoch loop there calls
      `set_loader_epoch(loader, epoch)` (a no-op on a loader without a
      DistributedSampler, for a caller outside the run), and the output is
      rank 0's. A DataLoader only handed to a function of the project that
      trains nothing (`evaluate(model, val_loader)`) stays whole (AM524).
      Where ddp refuses either file (a loss summed over the batch in the
      loop, say), neither is changed, and the script's finding names the loop.
      A class of another module that builds its own model and trains it
      on the DataLoader the script hands its constructor (`Solver(args,
      train_loader, test_loader)`) is made distributed the same way: the
      loader sharded in the script, the model wrapped in the class's
      module, whose epoch loop sets the loader's epoch.
      The helper modules a script imports that hold no training step (a
      `log` function, an early-stopping class that saves the best weights)
      get their output and file writes on rank 0 too, and the script reads
      a file after a call of such a writer after a `barrier()`.

Why
    DataParallel is one Python process driving every GPU: each step it
    copies the model to every GPU, scatters the batch, gathers the outputs
    on the first GPU and reduces the gradients there; the interpreter lock
    and GPU 0 become the bottleneck. DDP runs a process per GPU, each on its
    own share of the data, and overlaps the gradient all-reduce with the
    backward pass; it also spans machines. PyTorch recommends it over
    DataParallel even on one machine.

Example
    Before::

        model = nn.DataParallel(Net()).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(train_set, batch_size=256, shuffle=True)
        for epoch in range(10):
            for x, y in loader:
                ...
            print(f"epoch {epoch}")
        torch.save(model.state_dict(), "model.pt")

    After::

        init_distributed()
        model = Net().to(device)
        if is_distributed():
            model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(train_set, batch_size=per_process_batch_size(256), sampler=SeededDistributedSampler(train_set, shuffle=True))
        for epoch in range(10):
            loader.sampler.set_epoch(epoch)
            for x, y in loader:
                ...
            if is_main_process():
                print(f"epoch {epoch}")
        if is_main_process():
            torch.save(unwrap_model(model).state_dict(), "model.pt")

Left alone (a finding says what to do by hand)
    Scripts that already set up torch.distributed; several models in
    DataParallel where no optimizer shows which of them trains; no
    `backward()` (no training loop) or no optimizer over a model's
    parameters; a model trained through its own
    methods (`model.encode(x)` computing the loss outside `forward`: DDP
    synchronises gradients only through `model(...)`), or a model class whose own methods hold the training loop
    (a method cannot rebind `self`); a model rebound or moved after the
    wrap, returned from a function, or wrapped under a condition that does
    more than print and move the model; two backward passes through one forward
    (`retain_graph=True`); a loop exit under a condition that not every
    rank reaches, nor can be made to by deciding the tests around it;
    training DataLoaders with a custom `sampler=` or `batch_sampler=`,
    `**kwargs` beside their batch or shuffle arguments, no batch size, or no
    name of their own;
    epoch loops without a plain loop variable (`while`); output other than
    `print` whose arguments may run collectives (`logger.info(evaluate(model))`;
    `print(evaluate(model))` prints to a `NullWriter` on the other ranks, which
    still compute it), or that shares its line; a writer used other than through its methods
    (`writer.log_dir` read into a path); `download=True` on every rank; a `torch.load`
    that may read what rank 0 is still writing elsewhere (another function,
    or under a branch some ranks may not take); a file that only defines
    (where to call `init_distributed()`), or whose training loop is in an
    imported function given the model and optimizer built here, outside
    the files migrated with it or in a form the project facts do not read
    (a trainer class's method; the finding names the loop, AM521); a loader
    handed to such a loop that a third module builds is not sharded (AM521:
    every rank trains on the same batches). Evaluation DataLoaders stay whole:
    every rank evaluates the full set, so rank 0 prints the numbers a single
    process would. Names the migrated code needs but the file already uses
    stop the migration.
"""

from __future__ import annotations

from typing import Callable, Sequence

import libcst as cst

from ._base import dotted_name, keyword_arg
from ._syntax import in_place_of
from ._options import ddp_batch_mode
from ._ddp.common import RUNTIME, CannotMigrate, Edit, Insertion, Step, take_leading
from ._ddp.decisions import RankDecisions
from ._ddp.entry import ProcessGroupEntry
from ._ddp.loaders import LoaderSharding
from ._ddp.output import RankZeroOutput
from ._ddp.rank_totals import RankTotals
from ._ddp.sibling_loop import ImportedTrainingLoop
from ._ddp.wrap import ModelWrapping
from .script import vocabulary as v
from .script.uses import uses_of

# Names the migrated code uses; a file that binds one of them otherwise is left alone.
ADDED_NAMES = {
    "DistributedDataParallel": "torch.nn.parallel",
    "SeededDistributedSampler": RUNTIME,
    "init_distributed": RUNTIME,
    "is_distributed": RUNTIME,
    "is_main_process": RUNTIME,
    "ddp_device_ids": RUNTIME,
    "unwrap_model": RUNTIME,
    "world_size": RUNTIME,
    "per_process_batch_size": RUNTIME,
    "barrier": RUNTIME,
    "main_process_first": RUNTIME,
    "rank_local_buffers": RUNTIME,
    "rank_zero_decides": RUNTIME,
    "sum_across_ranks": RUNTIME,
    "average_across_ranks": RUNTIME,
    "sum_gradients_across_ranks": "accelmigrate.runtime.gradients",
    "draw_rank_share": RUNTIME,
    "rank_share": RUNTIME,
    "sharded_loader_kwargs": RUNTIME,
    "NullWriter": "accelmigrate.runtime.rank_zero",
    "set_loader_epoch": RUNTIME,
}
# Mechanical consequences of running on several ranks: one finding per file, at the first.
ONE_FINDING_PER_FILE = {
    "AM506": lambda n: (
        "printing, logging and file writes on rank 0 only, under `if is_main_process():`"
        + (f" ({n} statements, the first here)" if n > 1 else "")
    ),
    "AM507": lambda n: "tqdm bars on rank 0 only: `disable=not is_main_process()`" + (f" ({n} bars, the first here)" if n > 1 else ""),
    "AM533": lambda n: (
        "`per_process_batch_size(...)` where the loop that trains shapes tensors with the loader's batch size: each "
        "step holds this process's share of the batch the DataLoader now splits" + (f" ({n} sizes, the first here)" if n > 1 else "")
    ),
}
# Needed only where a file rank 0 writes is read back; a clash leaves those reads to the author.
ADDED_WHERE_NEEDED = frozenset({"set_loader_epoch", "sum_across_ranks", "average_across_ranks", "barrier", "main_process_first", "rank_zero_decides", "draw_rank_share", "rank_share", "sharded_loader_kwargs", "NullWriter"})


class DistributedDataParallelCodemod(
    ModelWrapping, LoaderSharding, RankZeroOutput, RankDecisions, RankTotals, ProcessGroupEntry, ImportedTrainingLoop
):
    word = "ddp"
    plans_in_visit_module = True  # see Codemod: its walk is skipped where it fixes nothing
    reads_handoffs = True  # a model wrapped here for a loop of another module: codemods/_ddp/handed_loops.py
    summary = "DataParallel or one process -> DistributedDataParallel, DistributedSampler, rank-0 output"
    requires = ("device", "main-guard")
    codes = {
        "AM501": "script that never joins the launch's process group",
        "AM502": "DataParallel: one process drives every GPU",
        "AM503": "trained model not wrapped in DistributedDataParallel",
        "AM504": "training DataLoader without a DistributedSampler",
        "AM505": "epoch loop without `sampler.set_epoch(epoch)`",
        "AM506": "printing, logging or file writes on every rank",
        "AM507": "tqdm bar shown on every rank",
        "AM508": "use of the model that needs the bare module (state_dict, its own methods and attributes, tracing)",
        "AM509": "--local_rank flag that torchrun no longer passes",
        "AM510": "learning rate not scaled for the per-process batch",
        "AM511": "loop exit decided on each rank's own value",
        "AM512": "backward through a graph already backpropagated (`retain_graph=True`)",
        "AM513": "DataParallel around a model that only runs inference",
        "AM514": "running total of a training loop read after it: one rank's share of the one-process total",
        "AM520": "model that cannot be wrapped safely",
        "AM521": "training loop, epoch loop or training DataLoader not found",
        "AM522": "DataLoader with a custom sampler",
        "AM523": "DataLoader whose batch size or arguments cannot be seen",
        "AM524": "evaluation DataLoader: every rank evaluates the full set",
        "AM525": "output that cannot be moved to rank 0 safely",
        "AM526": "script already distributed",
        "AM527": "model used through its own methods while training",
        "AM528": "file read that may race rank 0's write, or a writer every rank creates",
        "AM529": "learning rate that cannot be scaled",
        "AM530": "name needed by the migrated code already used",
        "AM531": "no entry point in this file to join the process group from",
        "AM532": "random draw sized by the batch, alike on every rank (a GAN's noise)",
        "AM533": "global batch size shaping this process's share of the batch",
        "AM534": "batch size that the processes cannot split evenly",
        "AM537": "folder created on every rank at once",
        "AM538": "BatchNorm statistics computed on each process's share of the batch (see sync-bn)",
        "AM535": "random draws (dropout, noise) made by each process for its share of the batch",
        "AM536": "data set or last batch that the processes share out unevenly",
        "AM539": "batch drawn without a DataLoader (by index, whole tensors, a function's results), alike on every rank",
    }
    # AM526: the script already sets up torch.distributed itself (or ddp's own
    # output does); nothing in it to change, only to launch.
    notes = frozenset({"AM524", "AM526", "AM535", "AM536", "AM538"})
    triggers = ("DataParallel", "DataLoader", "optim", "local_rank", "local-rank", "backward")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.per_process = ddp_batch_mode(self.options) == "per-process"
        self._edits: dict[cst.CSTNode, Edit] = {}
        self._before: dict[cst.CSTNode, list[Insertion]] = {}
        self._after: dict[cst.CSTNode, list[cst.BaseStatement]] = {}
        self._remove: set[cst.CSTNode] = set()
        self._comments_moved: set[cst.CSTNode] = set()  # removed statements whose comments went elsewhere
        self._guarded: set[cst.CSTNode] = set()
        self._steps: list[Step] = []
        self._rank_shared_draws: set[cst.Call] = set()  # draws sized by the batch that each rank takes its rows of
        self._unevenly_shared: list[cst.Call] = []  # training DataLoaders sharded without drop_last=True
        self._needed: set[str] = set()
        self._set_epoch_planned: set[tuple[cst.CSTNode, str]] = set()
        self._guard_planned: set[cst.CSTNode] = set()
        self._barrier_planned: set[cst.CSTNode] = set()
        self._training_loaders: list[cst.Call] = []

    # -- planning: everything is decided on the original tree, then applied ------------

    def visit_Module(self, node: cst.Module) -> bool:
        self._module = node
        self._config = node.config_for_parsing
        self._uses = uses_of(self.script)
        self._plan_local_rank()
        try:
            self._plan()
        except CannotMigrate as failure:
            self.report(failure.node, failure.code, failure.message)
            return True
        self._note_if_distributed_already()
        # Joining the group and wrapping the model go together with the rest:
        # sharding the data without them would train a model per rank.
        if any(self.is_suppressed(step.node, step.code) for step in self._steps if step.core):
            return True
        summarized: dict[str, list[Step]] = {}
        for step in self._steps:
            if step.code in ONE_FINDING_PER_FILE:
                if not self.is_suppressed(step.node, step.code):
                    summarized.setdefault(step.code, []).append(step)
                    step.apply()
            elif self.fix(step.node, step.code, step.message):
                step.apply()
        for code, steps in summarized.items():
            self.fix(steps[0].node, code, ONE_FINDING_PER_FILE[code](len(steps)))
        return True

    def _plan(self) -> None:
        self._refuse_if_already_distributed()
        self._refuse_on_name_clash()
        handed_to_classes = self._loaders_handed_to_classes()
        if handed_to_classes and not self._uses.backward_calls and not self._handed_calls():
            self._plan_built_loaders(handed_to_classes)  # for the class of another module that trains on them
            self._plan_rank_zero_output([])
            self._plan_init()
            return
        built = self._built_loader_calls()
        if built and not self._uses.backward_calls and not self._handed_calls():
            self._plan_built_loaders(built)  # for a training loop a script hands them to
            self._plan_rank_zero_output([])
            return
        if self._rank_zero_library() and not self._uses.backward_calls:
            self._plan_rank_zero_output([])  # a helper module of the script: its output is rank 0's
            return
        if not self._uses.backward_calls and not self._handed_calls():
            self._refuse_if_trained_elsewhere()
            first = next((c for c in self._uses.calls if self._is_model_or_loader_call(c)), None)
            if first is not None:
                raise CannotMigrate(
                    first, "AM521",
                    "no `backward()` call found, so no training loop: ddp changed nothing; wrap the model in "
                    "DistributedDataParallel and give the training DataLoader a DistributedSampler by hand",
                )
            return
        models = []
        # A loop of this module that a script hands its model and loader (codemods/_ddp/handed_loops.py).
        received = self._received_models() if self._uses.backward_calls and not self._update_sites() else []
        wrapped_before = self._calls_to(v.DISTRIBUTED_DATA_PARALLEL)  # migrated before
        if received:
            models = received
        elif not wrapped_before:
            models = self._plan_models()
        self._refuse_summed_losses_handed()
        self._plan_loaders()
        had_data_parallel = bool(self._calls_to(v.DATA_PARALLEL))
        for model in models:
            self._plan_model_references(model, had_data_parallel=had_data_parallel)
        for model in received:
            self._check_own_methods(model)
        self._refuse_retained_graphs(models)
        self._plan_learning_rates()
        self._plan_rank_zero_output(models or self._vars_wrapped_by(wrapped_before))
        self._plan_rank_decisions()
        if not received and not self._received_loader_classes():  # the script that hands them in joins the group
            self._plan_init()

    def _refuse_retained_graphs(self, models: list) -> None:
        """DDP all-reduces each parameter once per forward: a second backward
        through the same forward (actor and critic losses from one shared
        network) fails, or adds gradients DDP never reduces."""
        if not models:
            return
        for backward in self._uses.backward_calls:
            retain = keyword_arg(backward, "retain_graph")
            if retain is not None and not (isinstance(retain.value, cst.Name) and retain.value.value in ("False", "None")):
                raise CannotMigrate(
                    backward, "AM512",
                    "`retain_graph=True`: under DistributedDataParallel each forward allows one backward, so ddp "
                    "changed nothing; add the losses and call `backward()` once on their sum (the same gradients), "
                    "or give each loss its own forward, then run ddp again",
                )

    def _step(self, node: cst.CSTNode, code: str, message: str, apply: Callable[[], None], core: bool = False) -> None:
        self._steps.append(Step(node, code, message, apply, core))

    def _use(self, *names: str) -> None:
        for name in names:
            if name not in self._needed:
                self._needed.add(name)
                self.add_import(ADDED_NAMES[name], name)

    # -- refusals -----------------------------------------------------------------------

    def _imports_runtime(self) -> bool:
        return RUNTIME in self.script.star_imports or any(
            isinstance(b.statement, cst.ImportFrom) and dotted_name(b.statement.module) == RUNTIME
            for b in self.script.imports
        )

    def _refuse_if_already_distributed(self) -> None:
        # A file that imports the runtime may be ddp's own output, with its wraps
        # and samplers; it never starts processes or a group itself.
        ours = v.DISTRIBUTED_DATA_PARALLEL | v.DISTRIBUTED_SAMPLER if self._imports_runtime() else frozenset()
        found = self._calls_to(v.ALREADY_DISTRIBUTED - ours)
        if found:
            raise CannotMigrate(
                found[0], "AM526",
                "this script already sets up torch.distributed: ddp changed nothing; "
                "launch it with `accelmigrate run --nproc-per-node N`",
            )

    def _note_if_distributed_already(self) -> None:
        """A training script with nothing left to do (ddp's own output, run
        again) says so: ddp never changes nothing without a word."""
        wrapped = self._calls_to(v.DISTRIBUTED_DATA_PARALLEL) if self._uses.backward_calls and not self._steps else []
        if wrapped and not self.findings:
            self.report(
                wrapped[0], "AM526",
                "this script is distributed already (its model in DistributedDataParallel): ddp left it as it is; "
                "launch it with `accelmigrate run --nproc-per-node N`",
            )

    def _refuse_on_name_clash(self) -> None:
        candidates = [n for name in ADDED_NAMES.keys() - ADDED_WHERE_NEEDED for n in self._uses.names.get(name, ())]
        for node in sorted(candidates, key=self.script.index.order.__getitem__):
            if self._clashes(node):
                raise CannotMigrate(
                    node, "AM530",
                    f"`{node.value}` already names something in this file, and the migrated code needs that name: "
                    f"rename yours, then run ddp again",
                )

    def _clashes(self, node: cst.Name) -> bool:
        """`node` is a name the migrated code needs, bound to something else here."""
        if node.value not in ADDED_NAMES or self._is_member_name(node):
            return False
        expected = f"{ADDED_NAMES[node.value]}.{node.value}"
        return expected not in self.qualified_names(node) and not self._imported_from(node, ADDED_NAMES[node.value])

    def _is_member_name(self, name: cst.Name) -> bool:
        """An attribute or keyword name: `x.world_size`, `f(world_size=2)`."""
        parent = self.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            return True
        return isinstance(parent, cst.Arg) and parent.keyword is name

    def _imported_from(self, name: cst.Name, module: str) -> bool:
        for ancestor in self.ancestors(name):
            if isinstance(ancestor, cst.ImportFrom):
                return ancestor.module is not None and dotted_name(ancestor.module) == module
        return False

    # -- applying the plan --------------------------------------------------------------

    def on_leave(self, original_node, updated_node):
        updated_node = super().on_leave(original_node, updated_node)
        edit = self._edits.get(original_node)
        if edit is not None and not isinstance(updated_node, cst.RemovalSentinel):
            updated_node = in_place_of(updated_node, edit(updated_node))
        return updated_node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._rewrite_body(original_node.body, updated_node.body))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._rewrite_body(original_node.body, updated_node.body))

    def _rewrite_body(self, originals: Sequence[cst.CSTNode], updated: Sequence[cst.CSTNode]) -> list[cst.CSTNode]:
        if not any(s in self._before or s in self._after or s in self._guarded or s in self._remove for s in originals):
            return list(updated)
        result: list[cst.CSTNode] = []
        run: list[cst.CSTNode] = []  # consecutive statements to guard together
        carried: list[cst.EmptyLine] = []  # the leading lines of a removed statement

        def emit(statement: cst.CSTNode) -> None:
            nonlocal carried
            if run:
                result.append(self._guard(run))
                run.clear()
            if carried:
                statement = statement.with_changes(leading_lines=[*carried, *statement.leading_lines])
                carried = []
            result.append(statement)

        for original, statement in zip(originals, updated):
            for insertion in self._before.get(original, ()):
                statement, inserted = take_leading(statement, insertion)
                emit(inserted)
            if original in self._remove:
                carried.extend(
                    line for line in getattr(statement, "leading_lines", ())
                    if original not in self._comments_moved or line.comment is None
                )
            elif original in self._guarded:
                if carried:
                    statement = statement.with_changes(leading_lines=[*carried, *statement.leading_lines])
                    carried = []
                run.append(statement)
            else:
                emit(statement)
            for statement_after in self._after.get(original, ()):
                emit(statement_after)
        if run:
            result.append(self._guard(run))
        if not result:
            result.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried))
        elif any(line.comment is not None for line in carried):
            result.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried))
        return result

    def _guard(self, statements: list[cst.CSTNode]) -> cst.If:
        first = statements[0]
        inner = [first.with_changes(leading_lines=[]), *statements[1:]]
        return cst.If(
            test=cst.parse_expression("is_main_process()"),
            body=cst.IndentedBlock(body=inner),
            leading_lines=first.leading_lines,
        )
