"""ddp across the modules of a project: a script builds the model, its
optimizer and the training DataLoader and hands them to a loop in engine.py
(fixtures/projects/engine_loop: `train_one_epoch` called per epoch from
train.py; `fit`, whose epoch loop calls `fit_epoch`, from finetune.py; and
fixtures/projects/fold_trainer, whose loaders come from data.py). The model
is wrapped and the loader sharded where they are built, the loop's output
made rank 0's where it runs; two gloo processes end on the one-process
weights.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from accelmigrate.engine.migrate import process_files
from conftest import FIXTURES, run_python
from launching import ONE_PROCESS_TOLERANCE, Launch, cpu_env, on_two
from test_cli import invoke
from test_project import plan

PROJECT = FIXTURES / "projects" / "engine_loop"
EXPECTED = FIXTURES / "projects" / "expected" / "engine_loop" / "ddp"
SCRIPTS = ("train.py", "finetune.py")
# What each script saves at its end, the weights compared.
SAVED = {"train.py": "regressor.pt", "finetune.py": "fitted.pt"}


def copy_to(folder: Path) -> Path:
    shutil.copytree(PROJECT, folder)
    return folder


def migrated(folder: Path) -> Path:
    done = invoke("apply", "--to", "ddp", "--no-cache", "--runtime", *SCRIPTS, cwd=copy_to(folder))
    assert done.exit_code == 0, done.output
    return folder


def test_the_script_and_the_loop_module_are_migrated_as_one_change(tmp_path):
    project = migrated(tmp_path / "project")
    for name in (*SCRIPTS, "engine.py"):
        assert (project / name).read_text() == (EXPECTED / name.replace(".py", ".expected.py")).read_text(), name
    assert (project / "data.py").read_text() == (PROJECT / "data.py").read_text()
    again = invoke("apply", "--to", "ddp", "--no-cache", *SCRIPTS, cwd=project)
    assert "0 file(s) changed, 4 unchanged" in again.output, again.output
    # The validation loader is only handed to `evaluate`, which trains nothing: it stays whole, as a note.
    checked = invoke("check", "--to", "ddp", "--no-cache", "--show-notes", *SCRIPTS, cwd=PROJECT)
    assert "train.py:18:18: AM524" in checked.output and "AM521" not in checked.output, checked.output


@pytest.mark.slow
def test_two_processes_train_the_project_to_the_one_process_weights(tmp_path):
    original = copy_to(tmp_path / "original")
    printed = {script: run_python(original / script, cwd=original) for script in SCRIPTS}
    assert all(run.returncode == 0 for run in printed.values()), printed
    project = migrated(tmp_path / "migrated")
    launches = {}
    for script in SCRIPTS:  # each in a folder of its own, all at once
        folder = shutil.copytree(project, tmp_path / f"two-{script}")
        launches[script] = (folder, Launch(tmp_path, f"two-{script}", on_two(folder / script), cpu_env(), folder))
    for script in SCRIPTS:
        plain = run_python(project / script, cwd=project)  # a world of one: the original's run
        assert plain.returncode == 0 and plain.stdout == printed[script].stdout, plain.stderr
    for script, (folder, launch) in launches.items():
        launch.wait().succeeded()
        expected, trained = torch.load(original / SAVED[script]), torch.load(folder / SAVED[script])
        assert max((expected[k] - trained[k]).abs().max().item() for k in expected) <= ONE_PROCESS_TOLERANCE, script
        assert len(launch.stdout.splitlines()) == len(printed[script].stdout.splitlines()), launch.stdout  # once, by rank 0


SUMMED = ("y.to(device))\n        loss.backward()", "y.to(device), reduction=\"sum\")\n        loss.backward()")


def test_a_loop_module_ddp_refuses_leaves_the_scripts_that_hand_it_the_model_unwrapped(tmp_path):
    project = copy_to(tmp_path / "project")
    engine = project / "engine.py"
    assert SUMMED[0] in engine.read_text()
    engine.write_text(engine.read_text().replace(*SUMMED))  # `fit_epoch`, called by `fit`, now sums its loss
    results = process_files([str(project / s) for s in SCRIPTS], plan("ddp"), jobs=1, follow_imports=True)
    found = {Path(r.path).name: r for r in results}
    assert not any(f.fixed for r in results for f in r.findings if f.word == "ddp"), results
    assert [f.code for f in found["engine.py"].findings] == ["AM520"] and "sums over the batch" in found["engine.py"].findings[0].message
    for script in SCRIPTS:  # the loop elsewhere, named: neither half of the change is made
        assert [f.code for f in found[script].findings if f.word == "ddp"] == ["AM521"], found[script].findings


FOLD_TRAINER = FIXTURES / "projects" / "fold_trainer"


@pytest.mark.slow
def test_a_loader_built_in_a_data_module_is_sharded_there(tmp_path):
    original = shutil.copytree(FOLD_TRAINER, tmp_path / "original")
    project = shutil.copytree(FOLD_TRAINER, tmp_path / "migrated")
    done = invoke("apply", "--to", "ddp", "--no-cache", "train.py", cwd=project)
    assert "changed train.py: device, ddp" in done.output and "changed data.py: ddp" in done.output, done.output
    assert "SeededDistributedSampler(train_dataset, shuffle=True)" in (project / "data.py").read_text()
    assert "set_loader_epoch(train_loader, epoch)" in (project / "train.py").read_text()
    assert (project / "engine.py").read_text() == (FOLD_TRAINER / "engine.py").read_text()
    assert "0 file(s) changed" in invoke("apply", "--to", "ddp", "--no-cache", "train.py", cwd=project).output
    assert invoke("check", "--to", "ddp", "--no-cache", "train.py", cwd=project).exit_code == 0  # nothing left, no refusal
    two = Launch(tmp_path, "two", on_two(project / "train.py"), cpu_env(), project)
    before = run_python(original / "train.py", cwd=original)
    assert run_python(project / "train.py", cwd=project).stdout == before.stdout  # a world of one
    two.wait().succeeded()
    # Every rank validates the full set with the model it trained: rank 0 prints the one process's numbers.
    valid = [[float(line.split()[-1]) for line in run.splitlines()] for run in (before.stdout, two.stdout)]
    assert len(valid[0]) == len(valid[1]) == 4 and max(abs(a - b) for a, b in zip(*valid)) <= 2e-6, two.stdout


@pytest.mark.slow
def test_verify_runs_the_migrated_project_against_the_original(tmp_path):
    project = copy_to(tmp_path / "project")
    done = invoke("verify", "train.py", "--to", "ddp", "--steps", "6", cwd=project)
    assert done.exit_code == 0 and "same: 6 steps agree" in done.output and "2 processes against one" in done.output, done.output
    for name in ("train.py", "engine.py", "finetune.py", "data.py"):  # verify writes nothing of the project
        assert (project / name).read_text() == (PROJECT / name).read_text(), name


HELPERS = FIXTURES / "projects" / "helper_output"


def stopping_when_called(folder: Path) -> None:
    """The stopper's call as the test of an `if` (`if stopper(val, model):
    break`): its value is tested, not trained through."""
    (folder / "utils.py").write_text((folder / "utils.py").read_text().replace(
        "            self.early_stop = self.bad >= self.patience\n",
        "            self.early_stop = self.bad >= self.patience\n        return self.early_stop\n",
    ))
    script = folder / "train.py"
    script.write_text(script.read_text().replace(
        "        stopper(val, model)\n        if stopper.early_stop:\n", "        if stopper(val, model):\n",
    ))


@pytest.mark.slow
@pytest.mark.parametrize("tested", [False, True], ids=["called", "tested"])
def test_a_helper_modules_log_and_checkpoint_are_rank_zeros(tmp_path, tested):
    """utils.py's `log` prints and appends to a file, its EarlyStopping saves
    the best weights: under ddp rank 0 alone does both, the script reads the
    checkpoint back after a barrier, and the helper saves the model itself."""
    original = shutil.copytree(HELPERS, tmp_path / "original")
    project = shutil.copytree(HELPERS, tmp_path / "migrated")
    if tested:
        stopping_when_called(original)
        stopping_when_called(project)
    done = invoke("apply", "--to", "ddp", "--no-cache", "train.py", cwd=project)
    assert "changed utils.py: ddp" in done.output, done.output
    if tested:
        assert "if rank_zero_decides(stopper(val, unwrap_model(model))):" in (project / "train.py").read_text()
    for name in () if tested else ("train.py", "utils.py"):
        assert (project / name).read_text() == (EXPECTED.parent.parent / "helper_output" / "ddp" / f"{name[:-3]}.expected.py").read_text()
    assert "0 file(s) changed" in invoke("apply", "--to", "ddp", "--no-cache", "train.py", cwd=project).output
    two = Launch(tmp_path, "two", on_two(project / "train.py"), cpu_env(), project)
    before = run_python(original / "train.py", cwd=original)
    assert before.returncode == 0, before.stderr
    two.wait().succeeded()
    assert two.stdout == before.stdout  # each line once, with the one-process numbers
    assert (project / "train.log").read_text() == (original / "train.log").read_text()
    expected, trained = torch.load(original / "best.pt"), torch.load(project / "best.pt")
    assert max((expected[k] - trained[k]).abs().max().item() for k in expected) <= ONE_PROCESS_TOLERANCE


LOADER_FACTORY = """

def loader_of(data, batch_size=8):
    from torch.utils.data import DataLoader

    return DataLoader(data, batch_size=batch_size, shuffle=True)
"""


def test_a_script_ddp_refuses_leaves_its_helper_modules_alone(tmp_path):
    project = shutil.copytree(HELPERS, tmp_path / "project")
    script = project / "train.py"
    script.write_text(script.read_text().replace("loss.backward()", "loss.backward(retain_graph=True)"))  # AM512
    helpers = project / "utils.py"  # with a loader factory the script does not use
    helpers.write_text(helpers.read_text() + LOADER_FACTORY)
    results = process_files([str(script)], plan("ddp"), jobs=1, follow_imports=True)
    found = {Path(r.path).name: r for r in results}
    assert [f.code for f in found["train.py"].findings if f.word == "ddp"] == ["AM512"], found["train.py"].findings
    assert not found["utils.py"].changed and not found["utils.py"].findings, found["utils.py"]


SOLVER = FIXTURES / "projects" / "solver_class"


@pytest.mark.slow
def test_a_loader_handed_to_a_class_that_builds_its_model_is_sharded_where_it_is_built(tmp_path):
    """train.py builds the loaders and hands them to `Solver(args, train_loader,
    test_loader)`, whose own methods build the network and train it: the
    loader is sharded in train.py, the network wrapped in solver.py, whose
    epoch loop sets the loader's epoch; 2 processes end on the one-process weights."""
    original = shutil.copytree(SOLVER, tmp_path / "original")
    project = shutil.copytree(SOLVER, tmp_path / "migrated")
    done = invoke("apply", "--to", "ddp", "--no-cache", "train.py", cwd=project)
    assert "changed train.py: ddp" in done.output and "changed solver.py: device, ddp" in done.output, done.output
    for name in ("train.py", "solver.py"):
        assert (project / name).read_text() == (SOLVER.parent / "expected" / "solver_class" / "ddp" / f"{name[:-3]}.expected.py").read_text()
    again = invoke("check", "--to", "ddp", "--no-cache", "train.py", cwd=project)
    assert again.exit_code == 0 and "no findings" in again.output, again.output
    two = Launch(tmp_path, "two", on_two(project / "train.py"), cpu_env(), project)
    before = run_python(original / "train.py", cwd=original)
    assert before.returncode == 0 and run_python(project / "train.py", cwd=project).stdout == before.stdout
    two.wait().succeeded()
    expected, trained = torch.load(original / "solver.pt"), torch.load(project / "solver.pt")
    assert max((expected[k] - trained[k]).abs().max().item() for k in expected) <= ONE_PROCESS_TOLERANCE
    assert len(two.stdout.splitlines()) == len(before.stdout.splitlines())  # printed once, by rank 0


EMA_HELPER = FIXTURES / "projects" / "ema_helper"


@pytest.mark.slow
def test_an_ema_helper_of_another_module_gets_the_model_itself(tmp_path):
    """`ModelEMA(model)` and `ema.update(model)` (ema.py) copy the model's
    `state_dict()` into a deep copy of it: given the DDP wrapper, its keys
    would carry `module.` on 2 ranks and the update would fail. Both get
    `unwrap_model(model)`, and 2 processes end on the one-process average."""
    original = shutil.copytree(EMA_HELPER, tmp_path / "original")
    project = shutil.copytree(EMA_HELPER, tmp_path / "migrated")
    invoke("apply", "--to", "ddp", "--no-cache", "train.py", cwd=project)
    migrated = (project / "train.py").read_text()
    assert "ModelEMA(unwrap_model(model))" in migrated and "ema.update(unwrap_model(model))" in migrated, migrated
    two = Launch(tmp_path, "two", on_two(project / "train.py"), cpu_env(), project)
    before = run_python(original / "train.py", cwd=original)
    assert before.returncode == 0, before.stderr
    two.wait().succeeded()
    assert abs(float(two.stdout) - float(before.stdout)) <= ONE_PROCESS_TOLERANCE, two.stdout


STAR_IMPORTS = FIXTURES / "projects" / "star_imports"


@pytest.mark.slow
def test_a_script_that_gets_torch_through_the_projects_star_imports_is_made_distributed(tmp_path):
    """train.py imports nothing from torch itself: `from network import *`
    (which star-imports layers, which imports torch and nn) and DataLoader
    from data.py. Read alone, its optimizer and loader are nobody's and ddp
    refuses; read with the project, DataParallel becomes DDP, the loader is
    sharded, and 2 processes end on the one-process weights."""
    alone = invoke("check", "--to", "ddp", "--no-cache", "--no-follow-imports", "train.py", cwd=STAR_IMPORTS)
    assert "AM520" in alone.output, alone.output
    original = shutil.copytree(STAR_IMPORTS, tmp_path / "original")
    project = shutil.copytree(STAR_IMPORTS, tmp_path / "migrated")
    done = invoke("apply", "--to", "ddp", "--no-cache", "train.py", cwd=project)
    assert done.exit_code == 0 and "changed train.py: device, ddp" in done.output, done.output
    expected = FIXTURES / "projects" / "expected" / "star_imports" / "ddp" / "train.expected.py"
    assert (project / "train.py").read_text() == expected.read_text()
    assert invoke("check", "--to", "ddp", "--no-cache", "train.py", cwd=project).exit_code == 0  # nothing left
    two = Launch(tmp_path, "two", on_two(project / "train.py"), cpu_env(), project)
    before = run_python(original / "train.py", cwd=original)
    assert before.returncode == 0 and run_python(project / "train.py", cwd=project).stdout == before.stdout  # a world of one
    two.wait().succeeded()
    expected_weights, trained = torch.load(original / "regressor.pt"), torch.load(project / "regressor.pt")
    assert max((expected_weights[k] - trained[k]).abs().max().item() for k in expected_weights) <= ONE_PROCESS_TOLERANCE
    assert len(two.stdout.splitlines()) == len(before.stdout.splitlines())  # printed once, by rank 0


LOGGING_HELPERS = '''\
"""The run's log: one logger for the project, and `print` as its info."""
import logging
import sys

logging.basicConfig(stream=sys.stdout, format="%(message)s", level=logging.INFO)
logger = logging.getLogger("training")
print = logger.info
'''

LOGGED_TRAINING = '''\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from logs import logger, print


def main():
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(3):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}")
        logger.info(f"weights {model.weight.sum().item():.6f}")


if __name__ == "__main__":
    main()
'''


@pytest.mark.slow
def test_a_logger_and_a_print_bound_to_it_in_a_helper_module_log_on_rank_zero(tmp_path):
    """Issue 29, item 6: `print` bound to a logger's info in logs.py, and that
    logger, print each line once on two ranks (every rank printed every line)."""
    for folder in ("original", "migrated"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "logs.py").write_text(LOGGING_HELPERS)
        (tmp_path / folder / "train.py").write_text(LOGGED_TRAINING)
    project = tmp_path / "migrated"
    done = invoke("apply", "--to", "ddp", "--no-cache", "train.py", cwd=project)
    assert done.exit_code == 0, done.output
    migrated = (project / "train.py").read_text()
    assert 'if is_main_process():\n            print(f"epoch {epoch}")\n            logger.info(' in migrated
    before = run_python(tmp_path / "original" / "train.py", cwd=tmp_path / "original")
    assert before.returncode == 0 and before.stdout.count("epoch") == 3, before.stderr
    two = Launch(tmp_path, "two", on_two(project / "train.py"), cpu_env(), project)
    two.wait().succeeded()
    # Each line once, with the one-process weights (to 1e-5: two ranks average their gradients in another order).
    printed, expected = two.stdout.splitlines(), before.stdout.splitlines()
    assert [line.split()[0] for line in printed] == [line.split()[0] for line in expected]
    numbers = lambda lines: [float(word) for line in lines for word in line.split()[1:]]  # noqa: E731
    assert numbers(printed) == pytest.approx(numbers(expected), abs=1e-5)
