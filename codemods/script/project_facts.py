"""What the other files of a project tell about one file: facts the one-file
script model cannot see, worked out by the engine (accelmigrate/project.py)
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

The engine gives them for the file being migrated (`given`); a file migrated
on its own (an editor's buffer, stdin) has none.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Iterator


@dataclasses.dataclass(frozen=True)
class ProjectFacts:
    gradient_functions: frozenset = frozenset()
    device_parameters: frozenset = frozenset()
    imported_by_a_script: bool = False
    gpu_datasets: frozenset = frozenset()

    def key(self) -> str:
        """A stable text of the facts (part of the result cache's key)."""
        imported = "imported" if self.imported_by_a_script else ""
        names = (self.gradient_functions, self.device_parameters, self.gpu_datasets)
        return ";".join([*(",".join(sorted(n)) for n in names), imported])


NO_FACTS = ProjectFacts()
_current: contextvars.ContextVar = contextvars.ContextVar("project_facts", default=NO_FACTS)


def current() -> ProjectFacts:
    return _current.get()


@contextlib.contextmanager
def given(facts: ProjectFacts) -> Iterator[None]:
    """The facts of the file migrated within the block."""
    token = _current.set(facts)
    try:
        yield
    finally:
        _current.reset(token)
