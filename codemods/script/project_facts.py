"""What the other files of a project tell about one file: facts the one-file
script model cannot see, worked out by the engine (accelmigrate/project/modules.py)
and read by the codemods through `ScriptModel.project`.

- `gradient_functions`: the functions of the project's modules, named as
  this file's imports name them (`utils.clip_gradient`, `.engine.clip`),
  that clip or read gradients: a call of one between a scaled backward and
  the optimizer's step needs `scaler.unscale_()` first, as a direct
  `clip_grad_norm_` does.
- `device_parameters`: the parameters of this module's functions
  (`fit.device`) that every call of the function in the files migrated
  with it passes a device (`train_fn(model, loader, optimizer, DEVICE)` in
  `train.py`): what autocast reads the device type from there.
- `imported_by_a_script`: a script of the run imports this module (through
  its imports, transitively): its code runs in that script's processes, on
  the GPU that the script makes current, so a plain `.cuda()` there may
  become `device_at()` (the same GPU wherever CUDA is available).
- `gpu_datasets`: the dataset classes of the project's modules, named as
  this file's imports name them (`data.Points`), that put tensors on a GPU
  in their code: worker processes cannot, so their loaders get no workers.
- `training_loops`: the functions of the project's modules, named as this
  file's imports name them (`engine.train_one_epoch`), that this file hands
  the model its optimizer trains and the DataLoader that function's training
  loop iterates (`train_one_epoch(model, train_loader, optimizer)`): ddp
  wraps and shards here, where they are built, for the loop there.
- `evaluating_functions`: the functions of the project's modules, named as
  this file's imports name them (`engine.evaluate`), that call no
  backward (nor do the functions of their module they call): a DataLoader
  only handed to them feeds no training, and stays whole under ddp.
- `received_loops`: this module's functions that a script of the run hands
  its trained model and training DataLoader (the same calls, seen from the
  module that trains): ddp takes the model as wrapped and the loader as
  sharded there, and makes the function's output rank 0's.
- `sharded_loaders`: the functions of the project's modules, named as this
  file's imports name them, with the position of their result
  (`data.get_loaders`, 0; -1 for a single result), whose DataLoader this
  file hands such a loop, or its own training loop iterates: sharded
  where it is built.
- `time_first_loaders`: those of `sharded_loaders` whose collate function pads
  its sequences time-first (`pad_sequence` without `batch_first=True`): a
  batch accelerate dispatches would be cut along its time steps.
- `loader_classes`: the classes of the project's modules, named as this
  file's imports name them (`solver.Solver`), whose method trains on the
  DataLoader this file builds and hands their constructor
  (`Solver(config, train_loader, test_loader)`): ddp shards it here, where
  it is built.
- `received_loader_classes`: this module's such classes: ddp takes the
  attribute that keeps the loader (`self.training_loader`) as sharded, and
  leaves joining the process group to the script.
- `rank_zero_library`: a module a script of the run imports that holds no
  training step of its own (a logger, checkpoint and early-stopping
  helpers): ddp makes its output and file writes rank 0's, as the script's.
- `rank_zero_writers`: the functions and classes of those helper modules,
  named as this file's imports name them (`utils.EarlyStopping`), that
  write a file: rank 0 alone writes it now, so this file's reads of a file
  after their calls wait at a `barrier()` as after its own writes.
- `built_loaders`: this module's functions (and the position of their
  result) that build the DataLoader a script of the run hands a training
  loop: ddp gives it its sampler and split batch here.
- `star_names`: what this file's `from <project module> import *` binds,
  as (name, qualified name) pairs: the module's own imports (`nn` is
  `torch.nn`) and definitions (`Model` is `network.Model`), so that a
  script written on top of `from network import *` reads as if it
  imported them itself.
- `loggers`: the module-level names of the project's modules, named as
  this file's imports name them, bound to a logger (`utils.logger`, made
  by `logging.getLogger(...)`) or to a logger's method (`utils.print`,
  bound `print = logger.info`): what ddp keeps on rank 0, as a print.
- `optimizer_classes`: the classes of the project's modules, named as this
  file's imports name them (`optimization.BertAdam`, `optim.LARS`), that
  derive from torch's `Optimizer` or from an optimizer class: calling one
  makes an optimizer, as `torch.optim.SGD(...)` does.
- `reexports`: the names this file imports from a project module that
  itself imports them (`from preprocess import DataLoader`, where
  `preprocess` does `from torch.utils.data import DataLoader`), as
  (the name as imported, its qualified name) pairs.

The engine gives them for the file being migrated (`given`); a file migrated
on its own (an editor's buffer, stdin) has none.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Iterator

from . import vocabulary as v


@dataclasses.dataclass(frozen=True, order=True)
class LoopFunction:
    """A function that trains the model it is given on the loader it is
    given: its name (as the file that reads the fact names it), and the
    positions and names of those two parameters."""

    name: str
    model: str
    model_index: int
    loader: str
    loader_index: int
    # The mixed precision its autocast blocks train in ("fp16", "bf16"; "?" unread; "" none): the script that
    # hands it the model makes the Accelerator that runs it.
    mixed_precision: str = ""

    def argument(self, call_args: list, which: str):
        """The argument a call passes for the model or the loader
        (`which`), or None; `call_args` are (keyword or None, value) pairs."""
        name, index = (self.model, self.model_index) if which == "model" else (self.loader, self.loader_index)
        return argument_of(call_args, name, index)


def argument_of(call_args: list, name: str, index: int):
    """The argument a call passes for the parameter `name` at position
    `index`, or None; `call_args` are (keyword or None, value) pairs."""
    positional = [value for keyword, value in call_args if keyword is None]
    keywords = {keyword: value for keyword, value in call_args if keyword is not None}
    return keywords.get(name, positional[index] if index < len(positional) else None)


@dataclasses.dataclass(frozen=True, order=True)
class LoaderClass:
    """A class that trains on the DataLoader its constructor is given: its
    name (as the file that reads the fact names it), the constructor's
    parameter (name and position after `self`) and the attribute that keeps
    it (`Solver(config, train_loader)` keeping `self.training_loader`)."""

    name: str
    loader: str
    loader_index: int
    attribute: str


@dataclasses.dataclass(frozen=True)
class ProjectFacts:
    gradient_functions: frozenset = frozenset()
    device_parameters: frozenset = frozenset()
    imported_by_a_script: bool = False
    gpu_datasets: frozenset = frozenset()
    training_loops: frozenset = frozenset()  # of LoopFunction
    evaluating_functions: frozenset = frozenset()
    received_loops: frozenset = frozenset()  # of LoopFunction, named as the module names them
    sharded_loaders: frozenset = frozenset()  # of (function, position of its result)
    built_loaders: frozenset = frozenset()  # of (function, position of its result), this module's
    time_first_loaders: frozenset = frozenset()  # the sharded_loaders whose collate function pads time-first
    rank_zero_library: bool = False
    loader_classes: frozenset = frozenset()  # of LoaderClass, named as this file's imports name them
    received_loader_classes: frozenset = frozenset()  # of LoaderClass, this module's
    rank_zero_writers: frozenset = frozenset()
    star_names: frozenset = frozenset()  # of (name, qualified name)
    reexports: frozenset = frozenset()  # of ("preprocess.DataLoader", "torch.utils.data.DataLoader")
    loggers: frozenset = frozenset()  # "utils.logger", "utils.print"
    optimizer_classes: frozenset = frozenset()  # "optimization.BertAdam"

    @property
    def pairs(self) -> bool:
        """This file and another of the run make one change (a model wrapped
        here for a loop there, a loader sharded there for a loop here)."""
        return bool(
            self.training_loops or self.received_loops or self.sharded_loaders or self.built_loaders or self.rank_zero_library
            or self.rank_zero_writers or self.loader_classes or self.received_loader_classes
        )

    def unpaired(self) -> "ProjectFacts":
        """These facts without those that pair the file with another."""
        return dataclasses.replace(
            self, training_loops=frozenset(), received_loops=frozenset(), sharded_loaders=frozenset(), built_loaders=frozenset(),
            time_first_loaders=frozenset(), rank_zero_library=False, rank_zero_writers=frozenset(), loader_classes=frozenset(),
            received_loader_classes=frozenset(),
        )

    def key(self) -> str:
        """A stable text of the facts (part of the result cache's key)."""
        imported = ("imported" if self.imported_by_a_script else "") + ("library" if self.rank_zero_library else "")
        names = (
            self.gradient_functions, self.device_parameters, self.gpu_datasets, self.evaluating_functions, self.rank_zero_writers,
            {f"{name}={qualified}" for name, qualified in self.star_names | self.reexports}, self.loggers,
            self.optimizer_classes,
        )
        paired = (
            self.training_loops, self.received_loops, self.sharded_loaders, self.built_loaders, self.loader_classes,
            self.received_loader_classes, self.time_first_loaders,
        )
        loops = [",".join(map(repr, sorted(found))) for found in paired]
        return ";".join([*(",".join(sorted(n)) for n in names), imported, *loops])


NO_FACTS = ProjectFacts()
_current: contextvars.ContextVar = contextvars.ContextVar("project_facts", default=NO_FACTS)


def current() -> ProjectFacts:
    return _current.get()


def makes_optimizer(qualified: str) -> bool:
    """Does calling `qualified` make an optimizer: torch's and the known libraries' (vocabulary), or a class of
    the project's modules deriving from one?"""
    return v.makes_optimizer(qualified) or qualified in _current.get().optimizer_classes


@contextlib.contextmanager
def given(facts: ProjectFacts) -> Iterator[None]:
    """The facts of the file migrated within the block."""
    token = _current.set(facts)
    try:
        yield
    finally:
        _current.reset(token)
