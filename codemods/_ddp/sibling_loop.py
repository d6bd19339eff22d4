"""A training loop that lives in another module: the file builds a model
and its optimizer and hands both to an imported function (`from train_lib
import train`, `train(model, optimizer, loader)`). ddp migrates the file
that holds the loop and the model together, so it changes nothing here;
the finding says where the loop is and what the two files need.
"""

from __future__ import annotations

import sys
from typing import Optional

import libcst as cst

from .._base import walk
from .common import CannotMigrate, Var
from .queries import ScriptQueries

# Modules whose functions are no training loop of the script's own.
NOT_A_LOOP = frozenset({"torch", "torchvision", "torchaudio", "torchtext", "numpy", "accelmigrate"}) | frozenset(
    getattr(sys, "stdlib_module_names", ())
)


class ImportedTrainingLoop(ScriptQueries):
    """Finds the imported function that trains what this file builds."""

    def _refuse_if_trained_elsewhere(self) -> None:
        found = self._imported_training_call()
        if found is None:
            return
        call, function, module = found
        raise CannotMigrate(
            call, "AM521",
            f"the training loop runs in `{function}` (imported from `{module}`), given the model and the optimizer "
            f"built here: ddp changed nothing, since it migrates the loop where the model is built. Move the loop "
            f"into this file and run ddp again, or migrate both by hand: here `dist.init_process_group()` at the "
            f"entry point, the model wrapped in `DistributedDataParallel` before it is passed, the training "
            f"DataLoader given a `DistributedSampler`; in `{module}`, `loader.sampler.set_epoch(epoch)` at the top "
            f"of each epoch and its output under `if dist.get_rank() == 0:`",
        )

    def _imported_training_call(self) -> Optional[tuple[cst.Call, str, str]]:
        """(the call, the function's name, its module) for the first call of an
        imported function given both an optimizer built here and the model
        whose parameters it steps."""
        for optimizer in self._uses.calls:
            if not self.script.makes_optimizer(optimizer):
                continue
            model = self._model_stepped_by(optimizer)
            if model is None:
                continue
            for reference in self._optimizer_references(optimizer):
                argument = self.parent(reference)
                call = self.parent(argument) if isinstance(argument, cst.Arg) else None
                if not isinstance(call, cst.Call) or argument.value is not reference:
                    continue
                imported = self._imported_function(call)
                if imported is not None and any(
                    a is not argument and not a.star and self._var_of(a.value) == model for a in call.args
                ):
                    return (call, *imported)
        return None

    def _model_stepped_by(self, optimizer: cst.Call) -> Optional[Var]:
        """`model` of `SGD(model.parameters(), ...)` (or of a filter over them)."""
        if not optimizer.args:
            return None
        for node in walk(optimizer.args[0].value):
            if (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("parameters", "named_parameters")
            ):
                return self._root_var(node.func.value)
        return None

    def _optimizer_references(self, optimizer: cst.Call) -> list[cst.CSTNode]:
        """The optimizer itself, passed as it is built, or the reads of the name it is bound to."""
        parent = self.parent(optimizer)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and parent.value is optimizer:
            var = self._target_var(parent.targets[0].target)
            return self._references(var) if var is not None else []
        return [optimizer]

    def _imported_function(self, call: cst.Call) -> Optional[tuple[str, str]]:
        """(`train_lib.train`, `train_lib`) where `call` runs a function another
        module of the project may define: bound by an import, not torch's or the
        standard library's."""
        root = call.func
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name) or not any(b.kind == "import" for b in self.script.bindings_of(root.value, call)):
            return None
        for name in sorted(self.qualified_names(call.func)):
            module, _, function = name.rpartition(".")
            if module and module.lstrip(".").split(".")[0] not in NOT_A_LOOP:
                return name, module
        return None
