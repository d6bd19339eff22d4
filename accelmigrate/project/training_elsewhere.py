"""Where a script's training runs when the script itself holds no training
step: a first-party module it imports, directly or through other modules of
the project (files beside it or in a folder above it, never site-packages),
or a third-party library's trainer (Lightning, the Hugging Face Trainer, ...).

Real training code is a project: `main.py` parses the arguments and hands
them to a `Solver` in `solver.py`, or calls `engine.train_one_epoch`, or
gives a LightningModule to `Trainer.fit`. A word that acts on a training
step (amp, ddp, accelerate, ...) finds nothing to do in such a `main.py`;
left at that, it would change nothing and say nothing, and the user would
believe the script migrated. The engine then reports where the training is
(AM005 for a module of the project, AM006 for a library's trainer, with
that library's own switch), so the next step is plain.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from pathlib import Path
from typing import Optional

from accelmigrate.codemods._finding import Finding
from accelmigrate.codemods.script.precheck import SourceFacts, facts_of
from accelmigrate.project.modules import imports, reached_modules

TRAINING_ELSEWHERE = "AM005"  # engine codes: engine.ENGINE_CODES has their titles, explain.py their advice
TRAINER_LOOP = "AM006"
# Third-party trainers that run the loop themselves: the qualified name a
# script uses -> (the library, its own switches for what the words do).
TRAINERS = {
    "pytorch_lightning": ("PyTorch Lightning", "`Trainer(precision=\"16-mixed\" or \"bf16-mixed\", accelerator=\"gpu\", devices=N, strategy=\"ddp\")`"),
    "lightning.pytorch": ("Lightning", "`Trainer(precision=\"16-mixed\" or \"bf16-mixed\", accelerator=\"gpu\", devices=N, strategy=\"ddp\")`"),
    "lightning.Trainer": ("Lightning", "`Trainer(precision=\"16-mixed\" or \"bf16-mixed\", accelerator=\"gpu\", devices=N, strategy=\"ddp\")`"),
    "transformers.Trainer": ("the Hugging Face Trainer", "`TrainingArguments(fp16=True or bf16=True, dataloader_num_workers=N)`, launched with `torchrun` or `accelerate launch` for several GPUs"),
    "transformers.Seq2SeqTrainer": ("the Hugging Face Trainer", "`Seq2SeqTrainingArguments(fp16=True or bf16=True, dataloader_num_workers=N)`, launched with `torchrun` or `accelerate launch` for several GPUs"),
    "ignite.engine": ("PyTorch Ignite", "`create_supervised_trainer(..., amp_mode=\"amp\", scaler=True)` and `ignite.distributed.Parallel` for several GPUs"),
    "fastai": ("fastai", "`learn.to_fp16()` and `learn.distrib_ctx()` launched with `accelerate launch` for several GPUs"),
    "pytorch_tabnet": ("pytorch-tabnet", "its `device_name=` and `num_workers=` arguments of `fit`; it has no mixed precision or multi-GPU switch"),
    "skorch": ("skorch", "`NeuralNet(device=\"cuda\")`, and skorch's `AccelerateMixin` for mixed precision and several GPUs"),
}


@dataclasses.dataclass(frozen=True)
class Where:
    """Where the training runs: `file` is None for a third-party trainer."""

    line: int  # of the import in the script that leads there
    column: int
    module: str  # as the script names it (`solver`, `.engine`)
    file: Optional[Path] = None  # the project's module that trains
    trainer: str = ""  # the library whose trainer runs the loop (TRAINERS' key)


def training_findings(source: str, path: str, words: list[str], silenced: frozenset, covered: frozenset = frozenset()) -> list[Finding]:
    """AM005 or AM006 for `words` (acting on a training step, they changed
    and said nothing) where the file holds no backward of its own: the
    training runs in a module of the project, or in a library's trainer.
    Nothing where that module is one of the files `covered` (resolved) by
    the same run: the words act on it there, and speak there."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    facts = facts_of(tree, source)
    if facts.backward_calls:
        return []  # the words had their say on it
    found = where_training_runs(tree, facts, path)
    if not found or any(where.file in covered for where in found):
        return []
    first, listed = found[0], ",".join(words)
    if first.trainer:
        if TRAINER_LOOP in silenced:
            return []
        library, switches = TRAINERS[first.trainer]
        through = f" (through `{first.module}`, imported here)" if first.file else ""
        return [Finding(
            first.line, first.column, TRAINER_LOOP,
            f"no training step in this file: {library} runs the training loop{through}, so {listed} changed nothing "
            f"here. Use that library's own switches instead: {switches}",
            False, words[0],
        )]
    if TRAINING_ELSEWHERE in silenced:
        return []
    where = os.path.relpath(first.file, Path(path).resolve().parent)
    others = f" (also in {', '.join(f'`{m.module}`' for m in found[1:4])})" if len(found) > 1 else ""
    return [Finding(
        first.line, first.column, TRAINING_ELSEWHERE,
        f"no training step in this file: the training runs in `{where}` (reached through `{first.module}`, imported "
        f"here){others}, so {listed} changed nothing here. Migrate the training where it lives: `accelmigrate check "
        f"--to {listed} {where}` says what that module needs, with the model, optimizer and loaders this file hands it",
        False, words[0],
    )]


def where_training_runs(tree: ast.Module, facts: SourceFacts, path: str) -> list[Where]:
    """The modules of the project that hold a training step, reached from the
    script's imports (nearest first), or else the third-party trainer the
    script, or a module it reaches, hands its training to."""
    script = Path(path)
    trainer = _trainer_in(facts)
    trainers = [Where(*_first_import(tree, trainer), trainer, trainer=trainer)] if trainer else []
    if not script.is_file():  # an editor's buffer, stdin: nothing to look beside
        return trainers
    found = []
    for module in reached_modules(tree, script, follow=lambda module: not module.trains):
        where = (module.via.lineno, module.via.col_offset + 1, module.module, module.file)
        if module.trains:
            found.append(Where(*where))
        elif not trainers and (library := _trainer_in(module.facts)):
            trainers.append(Where(*where, library))
    return found or trainers


def _trainer_in(facts: SourceFacts) -> str:
    names = facts.references | facts.imported_modules
    return next((key for key in TRAINERS if any(n == key or n.startswith(key + ".") for n in names)), "")


def _first_import(tree: ast.Module, module: str) -> tuple[int, int, str]:
    """(line, column, name) of the first import of `module`'s package."""
    package = module.split(".")[0]
    for node, name in imports(tree):
        if name.split(".")[0] == package:
            return node.lineno, node.col_offset + 1, name
    return 1, 1, module
