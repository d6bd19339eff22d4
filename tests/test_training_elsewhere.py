"""AM005: a word that acts on a training step finds none in the file, whose
training runs in a module of the project it imports, directly or through
others (a `Solver` in `solver.py`, an `engine.train_one_epoch`); AM006: a
library's trainer runs the loop. The word changed nothing there, and says
where the training is instead of nothing at all."""

import json
import textwrap
from pathlib import Path

from accelmigrate.codemods import parse_words, resolve
from accelmigrate.engine.migrate import TRAINER_LOOP, TRAINING_ELSEWHERE, process_file, plan_of

SOLVER = """\
import torch


class Solver:
    def __init__(self, lr):
        self.net = torch.nn.Linear(4, 1)
        self.optim = torch.optim.Adam(self.net.parameters(), lr=lr)

    def train(self, steps):
        for _ in range(steps):
            loss = self.net(torch.randn(8, 4)).pow(2).mean()
            self.optim.zero_grad()
            loss.backward()
            self.optim.step()
"""
MAIN = """\
import argparse

from solver import Solver

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()
Solver(args.lr).train(10)
"""


def _findings(path: Path, words: str):
    result = process_file(str(path), plan_of(resolve(parse_words(words.split(",")))))
    assert result.error is None, result.error
    return result


def _project(tmp_path: Path, files: dict) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def test_a_script_whose_solver_trains_names_the_module(tmp_path):
    project = _project(tmp_path, {"main.py": MAIN, "solver.py": SOLVER})
    for words in ("ddp", "accelerate", "fabric", "checklist"):
        result = _findings(project / "main.py", words)
        elsewhere = [f for f in result.findings if f.code == TRAINING_ELSEWHERE]
        assert len(elsewhere) == 1, (words, result.findings)
        assert (elsewhere[0].line, elsewhere[0].column) == (3, 1)  # the import of the module
        assert "the training runs in `solver.py` (reached through `solver`, imported here)" in elsewhere[0].message
        assert not elsewhere[0].fixed


def test_the_module_that_trains_is_migrated_by_the_words_themselves(tmp_path):
    project = _project(tmp_path, {"main.py": MAIN, "solver.py": SOLVER})
    result = _findings(project / "solver.py", "checklist")
    assert result.changed and not any(f.code == TRAINING_ELSEWHERE for f in result.findings)


def test_no_finding_where_the_file_trains_or_nothing_imported_trains(tmp_path):
    project = _project(tmp_path, {"main.py": MAIN, "solver.py": "class Solver:\n    pass\n", "own.py": SOLVER + "\nSolver(1e-3).train(3)\n"})
    assert not [f for f in _findings(project / "main.py", "ddp").findings if f.code == TRAINING_ELSEWHERE]
    assert not [f for f in _findings(project / "own.py", "ddp").findings if f.code == TRAINING_ELSEWHERE]


def test_words_that_act_on_no_training_step_say_nothing_of_it(tmp_path):
    project = _project(tmp_path, {"main.py": MAIN, "solver.py": SOLVER})
    assert not [f for f in _findings(project / "main.py", "workers,item").findings if f.code == TRAINING_ELSEWHERE]


def test_relative_imports_and_parent_folders_are_followed(tmp_path):
    project = _project(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/engine.py": SOLVER,
        "pkg/run.py": "from .engine import Solver\n\nSolver(1e-3).train(3)\n",
        "tools/train.py": "from pkg.engine import Solver\n\nSolver(1e-3).train(3)\n",
    })
    for script, shown in ((project / "pkg" / "run.py", "engine.py"), (project / "tools" / "train.py", "../pkg/engine.py")):
        elsewhere = [f for f in _findings(script, "ddp").findings if f.code == TRAINING_ELSEWHERE]
        assert len(elsewhere) == 1 and f"runs in `{shown}`" in elsewhere[0].message, script


def test_an_installed_package_is_not_the_project(tmp_path):
    project = _project(tmp_path, {"main.py": MAIN, "venv/lib/site-packages/solver.py": SOLVER})
    (project / "main.py").write_text(MAIN.replace("from solver import Solver", "from venv.lib.site_packages.solver import Solver"))
    assert not [f for f in _findings(project / "main.py", "ddp").findings if f.code == TRAINING_ELSEWHERE]


def test_a_notebook_names_the_module_in_its_cell(tmp_path):
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# train"]},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": ["from solver import Solver\n", "s = Solver(1e-3)"]},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": ["s.train(3)"]},
    ]
    notebook = {"cells": cells, "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    project = _project(tmp_path, {"solver.py": SOLVER})
    (project / "train.ipynb").write_text(json.dumps(notebook))
    elsewhere = [f for f in _findings(project / "train.ipynb", "accelerate").findings if f.code == TRAINING_ELSEWHERE]
    assert len(elsewhere) == 1 and "`solver.py`" in elsewhere[0].message


def test_check_reports_it_and_fails_and_ignore_silences_it(tmp_path):
    from conftest import run_cli

    project = _project(tmp_path, {"main.py": MAIN, "solver.py": SOLVER})
    done = run_cli("check", "--to", "ddp", "--no-follow-imports", "main.py", cwd=project)
    assert done.returncode == 1 and "main.py:3:1: AM005 no training step in this file" in done.stdout, done.stdout + done.stderr
    quiet = run_cli("check", "--to", "ddp", "--no-follow-imports", "--ignore", "AM005", "main.py", cwd=project)
    assert "AM005" not in quiet.stdout
    # by default the module that trains is checked with the script, and speaks for itself
    followed = run_cli("check", "--to", "ddp", "main.py", cwd=project)
    assert "AM005" not in followed.stdout and "solver.py:" in followed.stdout, followed.stdout


def test_a_module_reached_through_others_and_split_steps_are_found(tmp_path):
    # main -> trainers (a factory) -> trainers/base.py, whose backward and step are in two methods
    base = """\
        class Trainer:
            def backward(self, loss):
                loss.backward()

            def update(self):
                self.optimizer.step()
        """
    project = _project(tmp_path, {
        "main.py": "from trainers import make_trainer\n\nmake_trainer().fit()\n",
        "trainers/__init__.py": "from .base import Trainer\n\n\ndef make_trainer():\n    return Trainer()\n",
        "trainers/base.py": base,
    })
    elsewhere = [f for f in _findings(project / "main.py", "ddp").findings if f.code == TRAINING_ELSEWHERE]
    assert len(elsewhere) == 1 and "runs in `trainers/base.py` (reached through `trainers`" in elsewhere[0].message


def test_a_library_trainer_names_its_own_switches(tmp_path):
    script = """\
        import pytorch_lightning as pl

        from model import LitModel

        trainer = pl.Trainer(max_epochs=3)
        trainer.fit(LitModel())
        """
    project = _project(tmp_path, {"train.py": script, "model.py": "import pytorch_lightning as pl\n\n\nclass LitModel(pl.LightningModule):\n    pass\n"})
    for words in ("ddp", "checklist", "accelerate"):
        found = [f for f in _findings(project / "train.py", words).findings if f.code in (TRAINER_LOOP, TRAINING_ELSEWHERE)]
        assert [f.code for f in found] == [TRAINER_LOOP], (words, found)
        assert found[0].line == 1 and "PyTorch Lightning runs the training loop" in found[0].message
        assert 'precision="16-mixed"' in found[0].message


def test_a_library_trainer_in_a_module_of_the_project(tmp_path):
    project = _project(tmp_path, {
        "run.py": "from engine import train\n\ntrain()\n",
        "engine.py": "from transformers import Trainer\n\n\ndef train():\n    Trainer().train()\n",
    })
    found = [f for f in _findings(project / "run.py", "fabric").findings if f.code == TRAINER_LOOP]
    assert len(found) == 1 and "the Hugging Face Trainer runs the training loop (through `engine`, imported here)" in found[0].message


def test_torch_read_from_a_star_import_is_not_imported_again():
    """A file that reads `torch` from `from config import *`: a codemod that
    writes `torch.compile` adds no `import torch` (the file has it already):
    an import added would let the next run resolve the file's own
    `torch.no_grad()`, and migrate it further (not idempotent)."""
    import libcst as cst
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor

    from accelmigrate.engine.migrate import add_imports, keep_star_imported_torch

    def with_torch_wanted(before: str, after: str) -> str:
        """`after` (a codemod's output) with the imports it asked for, `before` the file it read."""
        context = CodemodContext()
        AddImportsVisitor.add_needed_import(context, "torch")
        keep_star_imported_torch(context, cst.parse_module(before))
        return add_imports(context, cst.parse_module(after)).code

    star = "from config import *\n\n"
    assert "import torch" not in with_torch_wanted(star + "x = torch.zeros(2)\n", star + "x = torch.compile(torch.zeros(2))\n")
    # the torch read is the codemod's own: the star import may not bring torch, so it is imported
    assert "import torch" in with_torch_wanted(star + "x = 1\n", star + "x = torch.cuda.is_available()\n")
    assert "import torch" in with_torch_wanted("import numpy\n\nx = numpy.zeros(2)\n", "import numpy\n\nx = torch.zeros(2)\n")
