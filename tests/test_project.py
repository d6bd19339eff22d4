"""Projects, not files: `apply` and `check` on a script take in the modules
of its project that it reaches through its imports and that use torch
(accelmigrate/project/modules.py), migrate each where its part of the training
lives, and write them all together or not at all.

The fixture projects under fixtures/projects/ are ours, in the shapes real
projects take: a fold trainer whose loop and loaders live in `engine.py` and
`data.py`; a package laid out under `src/` with relative imports, run from
`tools/train.py` and from a notebook; a tagger written for one GPU whose
model, loss and batch helper each place their tensors with a bare `.cuda()`;
a script whose device is set in a config module.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from accelmigrate.codemods import parse_words, resolve
from accelmigrate.engine import migrate as engine
from accelmigrate.engine.migrate import TRAINING_ELSEWHERE, plan_of, process_files
from accelmigrate.project.modules import ProjectFiles
from conftest import FIXTURES, ON_EMULATED_CUDA, run_python
from test_cli import invoke

PROJECTS = FIXTURES / "projects"
EXPECTED = PROJECTS / "expected"
STEP_WORDS = ("checklist", "ddp", "accelerate", "fabric", "fsdp")
# Runs a script written for one GPU on the CPU, as it would compute with CUDA.


def copy_of(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(PROJECTS / name, tmp_path / name))


def plan(words: str):
    return plan_of(resolve(parse_words(words.split(","))))


def sources(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*.py*"))}


@pytest.mark.slow
def test_the_default_words_migrate_the_modules_the_script_reaches_and_it_trains_alike(tmp_path):
    project = copy_of("fold_trainer", tmp_path)
    before = run_python(project / "train.py")
    assert before.returncode == 0, before.stderr
    done = invoke("apply", "train.py", "--no-cache", cwd=project)
    assert done.exit_code == 0, done.output
    assert "changed engine.py: item, empty-cache" in done.output and "changed data.py: workers" in done.output
    expected = EXPECTED / "fold_trainer" / "default"
    for name in ("engine.py", "data.py"):
        assert (project / name).read_text() == (expected / name.replace(".py", ".expected.py")).read_text(), name
    assert (project / "train.py").read_text() == (PROJECTS / "fold_trainer" / "train.py").read_text()
    again = invoke("apply", "train.py", "--no-cache", cwd=project)
    assert "0 file(s) changed, 3 unchanged" in again.output, again.output
    after = run_python(project / "train.py")
    assert after.returncode == 0 and after.stdout == before.stdout, after.stderr  # the same losses, to 6 digits


@pytest.mark.parametrize("words", STEP_WORDS)
def test_words_on_the_training_step_speak_in_the_module_that_trains(words, tmp_path):
    project = copy_of("fold_trainer", tmp_path)
    results = process_files([str(project / "train.py")], plan(words), jobs=1, follow_imports=True)
    found = {Path(r.path).name: [f.code for f in r.findings] for r in results}
    assert set(found) == {"train.py", "engine.py", "data.py"}
    assert TRAINING_ELSEWHERE not in found["train.py"]
    if words == "ddp":  # the loop is handed the model and the loader: wrapped and sharded where they are built
        assert "AM503" in found["train.py"] and "AM504" in found["data.py"] and not found["engine.py"], found
    else:
        assert found["engine.py"], found  # the change or the manual step, where the loop is
    # data.py holds no training step: the words acting on one are not run there
    assert not [code for code in found["data.py"] if code[:4] in ("AM41", "AM52", "AM82", "AM92", "AM76")], found


def test_only_the_named_files_with_no_follow_imports(tmp_path):
    project = copy_of("fold_trainer", tmp_path)
    done = invoke("check", "--to", "amp", "--no-follow-imports", "--no-cache", "train.py", cwd=project)
    assert "train.py:5:1: AM005 no training step in this file: the training runs in `engine.py`" in done.output, done.output
    assert "engine.py:" not in done.output


def test_modules_without_torch_are_not_taken_in(tmp_path):
    project = copy_of("fold_trainer", tmp_path)
    (project / "settings.py").write_text("FOLDS = 2\n")
    (project / "train.py").write_text("from settings import FOLDS\n" + (project / "train.py").read_text())
    files = ProjectFiles.of([str(project / "train.py")]).files
    assert [Path(f).name for f in files] == ["train.py", "engine.py", "data.py"]


def test_a_module_two_scripts_reach_is_migrated_once_and_written_with_both(tmp_path):
    project = copy_of("fold_trainer", tmp_path)
    (project / "evaluate.py").write_text(
        "import torch\n\nimport engine\nfrom data import fold_loaders\n\n"
        "model = torch.load('model.pt', weights_only=False)\n"
        "print(engine.valid_fn(model, fold_loaders(0, 8)[1], torch.device('cpu')))\n"
    )
    files = ProjectFiles.of([str(project / "train.py"), str(project / "evaluate.py")])
    assert sorted(Path(f).name for f in files.files) == ["data.py", "engine.py", "evaluate.py", "train.py"]
    assert [sorted(Path(f).name for f in group) for group in files.groups()] == [["data.py", "engine.py", "evaluate.py", "train.py"]]
    done = invoke("apply", "--no-cache", "train.py", "evaluate.py", cwd=project)
    assert done.output.count("changed engine.py") == 1, done.output


def failing_writes(monkeypatch, name: str) -> None:
    """Writing the file called `name` fails as a full disk would."""
    real_write = engine.write_atomically

    def write(path, source, replacing=None):
        if Path(path).name == name:
            raise OSError(28, "No space left on device")
        real_write(path, source, replacing)

    monkeypatch.setattr(engine, "write_atomically", write)


def test_a_script_and_its_modules_are_written_all_or_nothing(tmp_path, monkeypatch):
    project = copy_of("fold_trainer", tmp_path)
    before = sources(project)
    failing_writes(monkeypatch, "data.py")
    results = process_files([str(project / "train.py")], plan("item,empty-cache,workers"), jobs=1, write=True, follow_imports=True)
    assert sources(project) == before  # engine.py, written first, is back as it was
    errors = {Path(r.path).name: r.error for r in results if r.error}
    assert "cannot write: No space left on device" in errors["data.py"]
    assert "not written, since" in errors["engine.py"] and not any(r.written for r in results)


def test_files_named_apart_stay_apart(tmp_path, monkeypatch):
    # a file that fails stops only the files of its own project
    project = copy_of("fold_trainer", tmp_path)
    (project / "broken.py").write_text("import torch\nfor x in range(3):\n    torch.cuda.empty_cache()\n")
    failing_writes(monkeypatch, "broken.py")
    results = process_files([str(project / "train.py"), str(project / "broken.py")], plan("item,empty-cache"), jobs=1, write=True, follow_imports=True)
    assert {Path(r.path).name for r in results if r.written} == {"engine.py"}
    assert "loss.detach()" in (project / "engine.py").read_text()
    assert "No space left" in next(r.error for r in results if r.path.endswith("broken.py"))


@pytest.mark.slow
def test_a_src_package_with_relative_imports_run_from_tools_and_a_notebook(tmp_path):
    project = copy_of("src_package", tmp_path)
    before = run_python(project / "tools" / "train.py", cwd=project)
    assert before.returncode == 0, before.stderr
    for entry in ("tools/train.py", "notebooks/fit.ipynb"):
        files = [Path(f).relative_to(project).as_posix() for f in ProjectFiles.of([str(project / entry)]).files]
        assert files == [entry, "src/wavefit/loop.py", "src/wavefit/data.py"], files
    done = invoke("check", "--to", "checklist", "--no-cache", "notebooks/fit.ipynb", cwd=project)
    # amp fixes the step in loop.py, whose device every caller passes; only item's manual step is left there
    assert "src/wavefit/loop.py:20:13: AM203" in done.output and "AM413" not in done.output, done.output
    assert "AM005" not in done.output
    applied = invoke("apply", "--to", "checklist", "--no-cache", "tools/train.py", cwd=project)
    assert "changed tools/train.py: device" in applied.output and "changed src/wavefit/loop.py: amp" in applied.output, applied.output
    loop = (project / "src" / "wavefit" / "loop.py").read_text()
    assert "    amp_dtype = autocast_dtype(device)\n" in loop and "device_type=torch.device(device).type," in loop
    after = run_python(project / "tools" / "train.py", cwd=project)
    assert after.returncode == 0 and after.stdout == before.stdout, after.stderr  # float32 on the CPU: the same losses


def test_a_device_every_caller_in_the_project_passes_is_a_fact_of_the_module(tmp_path):
    project = copy_of("fold_trainer", tmp_path)
    facts = ProjectFiles.of([str(project / "train.py")]).facts
    assert next(f for path, f in facts.items() if path.endswith("engine.py")).device_parameters == {"train_fn.device", "valid_fn.device"}
    (project / "other.py").write_text("import engine\n\nengine.valid_fn(None, [], 0)\n")  # an index, not a device
    facts = ProjectFiles.of([str(project / "train.py"), str(project / "other.py")]).facts
    engine_facts = next(f for path, f in facts.items() if path.endswith("engine.py"))
    assert engine_facts.device_parameters == {"train_fn.device"}


@pytest.mark.slow
def test_amp_in_a_loop_module_whose_optimizer_comes_from_the_caller_uses_the_optimizers_own_scaler(tmp_path):
    project = copy_of("fold_trainer", tmp_path)
    before = run_python(project / "train.py", cwd=project)
    results = process_files([str(project / "train.py")], plan("amp"), jobs=1, follow_imports=True, write=True, runtime=True)  # ACCELMIGRATE_PRECISION
    engine_result = next(r for r in results if r.path.endswith("engine.py"))
    assert [f.code for f in engine_result.findings if not f.fixed] == []
    engine_code = (project / "engine.py").read_text()
    assert "    amp_dtype = autocast_dtype(device)\n    scaler = scaler_for(optimizer, device, amp_dtype)\n" in engine_code
    assert "device_type=torch.device(device).type" in engine_code  # valid_fn's evaluation
    after = run_python(project / "train.py", cwd=project)
    assert after.returncode == 0 and after.stdout == before.stdout, after.stderr  # float32 on the CPU: the same losses
    # In float16 each call (each epoch) scales with the scaler of the calls before it.
    carried = run_python(project / "train.py", cwd=project, env={"ACCELMIGRATE_PRECISION": "fp16"})
    assert carried.returncode == 0, carried.stderr
    check = project / "carried.py"
    check.write_text(SCALER_CARRIED)
    done = run_python(check, cwd=project, env={"ACCELMIGRATE_PRECISION": "fp16"})
    assert done.returncode == 0 and done.stdout == "same scaler, used again\n", done.stderr


# The migrated engine's train_fn, called twice on one optimizer in float16.
SCALER_CARRIED = """\
import torch
from torch import nn

import engine
from accelmigrate.runtime.precision import scaler_for
from data import fold_loaders

torch.manual_seed(0)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loader, _ = fold_loaders(0, batch_size=8)
engine.train_fn(model, loader, optimizer, "cpu")
scaler = scaler_for(optimizer, "cpu", torch.float16)
state = scaler.state_dict()
engine.train_fn(model, loader, optimizer, "cpu")
assert scaler_for(optimizer, "cpu", torch.float16) is scaler and scaler.is_enabled()
print("same scaler, used again" if scaler.state_dict() != state else "same scaler, unused")
"""


def test_words_that_would_both_own_the_script_are_a_usage_error(tmp_path):
    project = copy_of("fold_trainer", tmp_path)
    for words, clash in (("checklist,accelerate", "accelerate cannot run with workers, device, amp"), ("ddp,fsdp", "fsdp cannot run with ddp"), ("fabric,accelerate", "accelerate cannot run with fabric")):
        done = invoke("apply", "--to", words, "train.py", cwd=project)
        assert done.exit_code == 2 and clash in done.output, (words, done.output)
    assert sources(project) == sources(PROJECTS / "fold_trainer")


@pytest.mark.slow
def test_cuda_placements_in_the_modules_a_script_imports_follow_its_gpu(tmp_path):
    project = copy_of("gpu_helpers", tmp_path)
    before = run_python(ON_EMULATED_CUDA, str(project / "train.py"), cwd=project)
    assert before.returncode == 0 and before.stdout.count("loss:") == 3, before.stderr
    done = invoke("apply", "--to", "device", "--no-cache", "train.py", cwd=project)
    assert done.exit_code == 0 and "4 file(s) changed" in done.output, done.output  # utils.py places without importing torch
    expected = EXPECTED / "gpu_helpers" / "device"
    for name in ("train.py", "model.py", "losses.py", "utils.py"):
        assert (project / name).read_text() == (expected / name.replace(".py", ".expected.py")).read_text(), name
    again = invoke("apply", "--to", "device", "--no-cache", "train.py", cwd=project)
    assert "0 file(s) changed, 4 unchanged" in again.output, again.output
    after = run_python(project / "train.py", cwd=project)
    assert after.returncode == 0 and after.stdout == before.stdout, after.stderr  # the same losses, to 6 digits
    project = copy_of("gpu_helpers", tmp_path / "checklist")
    invoke("apply", "--to", "checklist", "--no-cache", "train.py", cwd=project)
    after = run_python(project / "train.py", cwd=project)
    assert after.returncode == 0 and after.stdout == before.stdout, after.stderr  # float32 on the CPU


def test_a_library_module_on_its_own_keeps_its_cuda_placements():
    # Without the script that imports it, no GPU is known to be current when it runs.
    result = engine.migrate_source((PROJECTS / "gpu_helpers" / "model.py").read_text(), plan("device"), "model.py")
    assert "h0 = torch.zeros(1, tokens.size(0), self.hidden).cuda()" in result.code
    assert [f.code for f in result.findings] == ["AM311"]


@pytest.mark.slow
def test_a_device_set_in_a_config_module_follows_the_script_that_imports_it(tmp_path):
    project = copy_of("config_device", tmp_path)
    before = run_python(project / "train.py", cwd=project)
    assert before.returncode == 0 and before.stdout.count("loss:") == 3, before.stderr
    done = invoke("apply", "--to", "checklist", "--no-cache", "train.py", cwd=project)
    assert "changed config.py: device" in done.output and "changed train.py: amp" in done.output, done.output
    expected = EXPECTED / "config_device" / "checklist"
    for name in ("train.py", "config.py"):
        assert (project / name).read_text() == (expected / name.replace(".py", ".expected.py")).read_text(), name
    assert "0 file(s) changed, 2 unchanged" in invoke("apply", "--to", "checklist", "--no-cache", "train.py", cwd=project).output
    after = run_python(project / "train.py", cwd=project)
    assert after.returncode == 0 and after.stdout == before.stdout, after.stderr  # float32 on the CPU: the same losses
    # On its own, the config module is a library whose callers choose the device.
    alone = engine.migrate_source((PROJECTS / "config_device" / "config.py").read_text(), plan("device"), "config.py")
    assert [f.code for f in alone.findings] == ["AM303"] and not alone.findings[0].fixed


GPU_DATASET = """\
import torch
from torch.utils.data import Dataset


class Points(Dataset):
    def __init__(self, n):
        self.x = torch.randn(n, 2)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]{placed}, self.x[i].sum(){placed}
"""
LOADED = """\
import torch
from torch.utils.data import DataLoader

from data import Points

loader = DataLoader(Points(64), batch_size=8, shuffle=True)
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("placed, workers", [(".cuda()", False), ("", True)])
def test_a_dataset_of_another_module_that_places_on_the_gpu_gets_no_workers(placed, workers, tmp_path):
    (tmp_path / "data.py").write_text(GPU_DATASET.format(placed=placed))
    (tmp_path / "train.py").write_text(LOADED)
    done = invoke("apply", "--to", "workers,device", "--no-cache", "train.py", cwd=tmp_path)
    assert done.exit_code == 0, done.output
    assert ("num_workers=" in (tmp_path / "train.py").read_text()) == workers
    again = invoke("check", "--to", "workers", "--no-cache", "train.py", cwd=tmp_path)  # data.py migrated: `.to(device)`
    assert ("AM108 left without workers: dataset class data.Points" in again.output) != workers, again.output
