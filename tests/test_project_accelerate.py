"""accelerate and fabric across the modules of a project: a script builds
the model, its optimizer and the training DataLoader and hands them to a
loop in engine.py (fixtures/projects/engine_loop: `train_one_epoch` called
per epoch from train.py). The script prepares them (sets them up) and passes
`accelerator=accelerator` (`fabric=fabric`); the loop takes the parameter
and routes its backward, printing and running total through it. Under plain
`python` the migrated project prints the original's lines; two gloo
processes end on the one-process weights and print once. What either file
cannot make right leaves both unchanged.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from accelmigrate.engine.migrate import process_files
from conftest import FIXTURES, exact, run_python
from launching import ONE_PROCESS_TOLERANCE, Launch, cpu_env, on_two
from test_cli import invoke
from test_project import plan

PROJECT = FIXTURES / "projects" / "engine_loop"
EXPECTED = FIXTURES / "projects" / "expected" / "engine_loop"
WORDS = ("accelerate", "fabric")
# Fabric's DistributedSampler draws its own order (note AM910): its copy compares on an unshuffled loader.
UNSHUFFLED = ("batch_size=8, shuffle=True)", "batch_size=8)")


def copy_to(folder: Path) -> Path:
    shutil.copytree(PROJECT, folder)
    return folder


def migrated(folder: Path, word: str = "accelerate", *scripts: str, parity: bool = True):
    words = exact(word) if parity else word
    return process_files([str(folder / s) for s in scripts or ("train.py",)], plan(words), jobs=1, follow_imports=True, write=True)


def findings(results) -> dict[str, list[str]]:
    return {Path(r.path).name: [f"{f.line}:{f.column} {f.code}" for f in r.findings if not f.fixed] for r in results}


@pytest.mark.parametrize("word", WORDS)
def test_the_script_and_its_loop_module_are_migrated_as_one_change(tmp_path, word):
    project = copy_to(tmp_path / "project")
    done = invoke("apply", "--to", exact(word), "--no-cache", "train.py", cwd=project)
    assert done.exit_code == 0 and "2 file(s) changed" in done.output, done.output
    for name in ("train.py", "engine.py"):
        assert (project / name).read_text() == (EXPECTED / word / name.replace(".py", ".expected.py")).read_text(), name
    for name in ("data.py", "finetune.py"):  # finetune.py's `fit` loop is no script's of this run: left as it is
        assert (project / name).read_text() == (PROJECT / name).read_text(), name
    again = invoke("apply", "--to", exact(word), "--no-cache", "train.py", cwd=project)
    assert again.exit_code == 0 and "0 file(s) changed, 3 unchanged" in again.output, again.output


@pytest.mark.slow
@pytest.mark.parametrize("word", WORDS)
def test_two_processes_train_the_project_to_the_one_process_weights(tmp_path, word):
    original = copy_to(tmp_path / "original")
    if word == "fabric":
        script = original / "train.py"
        script.write_text(script.read_text().replace(*UNSHUFFLED))
    project = shutil.copytree(original, tmp_path / "migrated")  # before the original writes its weights
    printed = run_python(original / "train.py", cwd=original)
    assert printed.returncode == 0, printed.stderr
    migrated(project, word)
    folder = shutil.copytree(project, tmp_path / "two")
    launch = Launch(tmp_path, "two", on_two(folder / "train.py"), cpu_env(), folder)
    plain = run_python(project / "train.py", cwd=project)  # a world of one: the original's run
    assert plain.returncode == 0 and plain.stdout == printed.stdout, plain.stderr
    launch.wait().succeeded()
    expected, trained = torch.load(original / "regressor.pt"), torch.load(folder / "regressor.pt")
    assert max((expected[k] - trained[k]).abs().max().item() for k in expected) <= ONE_PROCESS_TOLERANCE
    lines = launch.stdout.splitlines()
    assert len(lines) == len(printed.stdout.splitlines()), launch.stdout  # once, by the main process
    # The epoch lines read the losses combined across the processes: the one-process figures.
    epochs = [line.split(" val ")[0] for line in printed.stdout.splitlines() if line.startswith("epoch")]
    assert [line.split(" val ")[0] for line in lines if line.startswith("epoch")] == epochs


SUMMED = ("criterion = nn.MSELoss()", 'criterion = nn.MSELoss(reduction="sum")')


@pytest.mark.parametrize("word, code", [("accelerate", "AM823"), ("fabric", "AM923"), ("ddp", "AM520")])
def test_a_criterion_that_sums_handed_to_the_loop_leaves_both_files_unchanged(tmp_path, word, code):
    """The loop in engine.py cannot see how the criterion it is handed reduces:
    under DDP's average its summed loss would train with a fraction of the
    original's gradient (ddp migrated this without a finding before)."""
    project = copy_to(tmp_path / "project")
    script = project / "train.py"
    script.write_text(script.read_text().replace(*SUMMED))
    before = (project / "engine.py").read_text()
    results = migrated(project, word)
    assert f"20:70 {code}" in findings(results)["train.py"], results
    assert not any(f.fixed for r in results for f in r.findings if f.word == word), results  # (ddp's device word may fix)
    assert (project / "engine.py").read_text() == before


@pytest.mark.parametrize("word, code", [("accelerate", "AM820"), ("fabric", "AM920")])
def test_a_module_handed_two_loops_is_refused_and_nothing_changes(tmp_path, word, code):
    project = copy_to(tmp_path / "project")
    before = {p.name: p.read_text() for p in project.glob("*.py")}
    results = migrated(project, word, "train.py", "finetune.py")
    engine = next(r for r in results if r.path.endswith("engine.py"))
    assert [f.code for f in engine.findings] == [code] and "`fit`, `train_one_epoch`" in engine.findings[0].message
    assert {p.name: p.read_text() for p in project.glob("*.py")} == before


AUTOCAST = (
    "    model.train()\n    total = 0.0\n",
    "    model.train()\n    scaler = torch.cuda.amp.GradScaler()\n    total = 0.0\n",
    "        loss = criterion(model(x), y)\n        loss.backward()\n        optimizer.step()\n        total",
    "        with torch.autocast(\"cuda\"):\n            loss = criterion(model(x), y)\n"
    "        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        total",
)


def with_mixed_precision(engine: Path) -> None:
    text = engine.read_text()
    assert AUTOCAST[0] in text and AUTOCAST[2] in text
    engine.write_text(text.replace(AUTOCAST[0], AUTOCAST[1], 1).replace(AUTOCAST[2], AUTOCAST[3], 1))


@pytest.mark.parametrize("word, made_with", [
    ("accelerate", 'mixed_precision="fp16" if torch.cuda.is_available() else "no"'),
    ("fabric", 'precision="16-mixed" if torch.cuda.is_available() else "32-true"'),
])
def test_the_loops_mixed_precision_moves_onto_the_scripts_accelerator(tmp_path, word, made_with):
    """The loop's autocast block and GradScaler go; the script's Accelerator (Fabric) is made with their dtype.
    On this machine without CUDA the original's CUDA autocast was off, and so is the Accelerator's."""
    original = copy_to(tmp_path / "original")
    with_mixed_precision(original / "engine.py")
    project = shutil.copytree(original, tmp_path / "migrated")
    migrated(project, word)
    script, engine = (project / "train.py").read_text(), (project / "engine.py").read_text()
    assert made_with in script
    assert "autocast" not in engine and "scaler" not in engine and f"{'accelerator' if word == 'accelerate' else 'fabric'}.backward(loss)\n        optimizer.step()" in engine
    assert not any(f.fixed for r in migrated(project, word) for f in r.findings)  # idempotent
    printed, plain = run_python(original / "train.py", cwd=original), run_python(project / "train.py", cwd=project)
    assert printed.returncode == 0 and plain.returncode == 0 and plain.stdout == printed.stdout, plain.stderr


def test_a_scaler_the_script_hands_the_loop_is_refused_and_nothing_changes(tmp_path):
    """A GradScaler made in the script and stepped in the module: the Accelerator would scale the loss a second way."""
    project = copy_to(tmp_path / "project")
    with_mixed_precision(project / "engine.py")
    engine, script = project / "engine.py", project / "train.py"
    engine.write_text(engine.read_text().replace("    scaler = torch.cuda.amp.GradScaler()\n", "").replace("device, log_every=4)", "device, scaler, log_every=4)"))
    script.write_text(script.read_text().replace(
        "    criterion = nn.MSELoss()\n", "    criterion = nn.MSELoss()\n    scaler = torch.cuda.amp.GradScaler()\n"
    ).replace("criterion, device)", "criterion, device, scaler)"))
    before = {p.name: p.read_text() for p in project.glob("*.py")}
    found = findings(migrated(project))
    assert any(code.endswith("AM821") for code in found["train.py"] + found["engine.py"]), found
    assert {p.name: p.read_text() for p in project.glob("*.py")} == before


# fixtures/projects/modular_steps: a flat script whose loaders come from data_setup.py, whose epochs run in
# engine.train (handing each one to train_step with keyword arguments) and whose model utils.save_model writes.
MODULAR = FIXTURES / "projects" / "modular_steps"


def test_a_script_of_modules_moves_onto_accelerate_where_each_part_lives(tmp_path):
    project = shutil.copytree(MODULAR, tmp_path / "project")
    results = migrated(project)
    assert not any(f for r in results for f in r.findings if not f.fixed and f.code != "AM811"), results
    for name in ("train.py", "engine.py"):
        expected = EXPECTED.parent / "modular_steps" / "accelerate" / name.replace(".py", ".expected.py")
        assert (project / name).read_text() == expected.read_text(), name
    for name in ("data_setup.py", "utils.py"):
        assert (project / name).read_text() == (MODULAR / name).read_text(), name
    assert not any(f.fixed for r in migrated(project) for f in r.findings)  # idempotent


def test_the_loop_of_a_script_of_modules_is_found_whatever_its_step_calls_first(tmp_path):
    """`loss_fn(model(X), y)`: the epoch function hands train_step the criterion and the model, both called in
    its loop; the model is the one the script trains (ddp took the criterion for it and left the project alone)."""
    project = shutil.copytree(MODULAR, tmp_path / "project")
    found = findings(migrated(project, "ddp"))
    assert not any(code.endswith("AM521") for codes in found.values() for code in codes), found
    assert "DistributedDataParallel" in (project / "train.py").read_text()


def test_fabric_leaves_a_script_whose_loader_another_module_builds(tmp_path):
    """Fabric would have each process load `batch_size // fabric.world_size`, where data_setup.py builds the loader."""
    project = shutil.copytree(MODULAR, tmp_path / "project")
    before = {p.name: p.read_text() for p in project.glob("*.py")}
    found = findings(migrated(project, "fabric"))
    assert "16:50 AM929" in found["train.py"], found
    assert {p.name: p.read_text() for p in project.glob("*.py")} == before


def test_by_default_fabric_sets_up_the_loader_another_module_builds(tmp_path):
    """Fabric's default keeps each process's batch as the loader was built: nothing to divide in data_setup.py."""
    project = shutil.copytree(MODULAR, tmp_path / "project")
    found = findings(migrated(project, "fabric", parity=False))
    assert set(found["train.py"]) <= {"13:1 AM934", "16:50 AM911"}, found
    assert "train_dataloader = fabric.setup_dataloaders(train_dataloader)" in (project / "train.py").read_text()


@pytest.mark.slow
def test_two_processes_train_a_script_of_modules_to_the_one_process_weights(tmp_path):
    """The shuffled loader data_setup.py builds is dispatched from the main process: the original's order."""
    original = shutil.copytree(MODULAR, tmp_path / "original")
    project = shutil.copytree(MODULAR, tmp_path / "migrated")
    printed = run_python(original / "train.py", cwd=original)
    assert printed.returncode == 0, printed.stderr
    migrated(project)
    folder = shutil.copytree(project, tmp_path / "two")
    launch = Launch(tmp_path, "two", on_two(folder / "train.py"), cpu_env(), folder)
    plain = run_python(project / "train.py", cwd=project)
    assert plain.returncode == 0 and plain.stdout == printed.stdout, plain.stderr
    launch.wait().succeeded()
    assert launch.stdout == printed.stdout  # once, with the one-process epoch losses
    expected, trained = (torch.load(f / "models" / "classifier.pth") for f in (original, folder))
    assert list(trained) == list(expected)  # the bare model's keys, written by the main process
    assert max((expected[k] - trained[k]).abs().max().item() for k in expected) <= ONE_PROCESS_TOLERANCE
