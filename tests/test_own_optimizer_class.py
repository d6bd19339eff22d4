"""An optimizer the project writes itself (a class deriving from torch's
`Optimizer`: a LARS, a vendored BertAdam) makes an optimizer as
`torch.optim.SGD(...)` does, whether the script defines it
(fixtures/ddp/optimizer_class_of_the_script.py) or imports it from a module
of its project (fixtures/projects/own_optimizer): ddp wraps the model it
trains, and two gloo processes end on the one-process weights."""

from __future__ import annotations

import ast
import shutil

import pytest
import torch

from accelmigrate.project.modules import optimizer_classes
from conftest import FIXTURES, exact, run_python
from launching import ONE_PROCESS_TOLERANCE, Launch, cpu_env, on_two
from test_cli import invoke
from test_ddp_param_groups import expected_pair_parity

PROJECT = FIXTURES / "projects" / "own_optimizer"
EXPECTED = FIXTURES / "projects" / "expected" / "own_optimizer"


def test_the_classes_that_derive_from_an_optimizer_are_found():
    tree = ast.parse(
        "import torch\nfrom torch import optim\nfrom torch.optim import Optimizer as Base\nimport torch.nn as nn\n"
        "class A(Base): pass\nclass B(optim.SGD): pass\nclass C(A): pass\nclass D(torch.optim.optimizer.Optimizer): pass\n"
        "class E(nn.Module): pass\nclass F(object): pass\nclass G(torch.optim.lr_scheduler.LRScheduler): pass\n"
    )
    assert list(optimizer_classes(tree)) == ["A", "B", "C", "D"]


@pytest.mark.slow
def test_the_scripts_own_optimizer_class_trains_on_two_processes_to_the_one_process_weights(tmp_path):
    parity = expected_pair_parity(FIXTURES / "ddp" / "optimizer_class_of_the_script.py", tmp_path)
    assert parity.verdict == "same", parity.why


@pytest.mark.parametrize("word", ["ddp", "accelerate", "fabric", "checklist"])
def test_an_optimizer_imported_from_the_project_is_migrated_by_every_word(tmp_path, word):
    project = shutil.copytree(PROJECT, tmp_path / "project")
    done = invoke("apply", "--to", exact(word), "--no-cache", "--runtime", "train.py", cwd=project)
    assert done.exit_code == 0 and "1 file(s) changed, 1 unchanged" in done.output, done.output
    checked = invoke("check", "--to", exact(word), "--no-cache", "train.py", cwd=project)
    assert checked.exit_code == 0, checked.output  # nothing left, no refusal
    if word == "ddp":
        assert (project / "train.py").read_text() == (EXPECTED / "ddp" / "train.expected.py").read_text()


@pytest.mark.slow
def test_an_optimizer_imported_from_the_project_trains_on_two_processes_to_the_one_process_weights(tmp_path):
    original = shutil.copytree(PROJECT, tmp_path / "original")
    project = shutil.copytree(PROJECT, tmp_path / "migrated")
    shutil.copy(EXPECTED / "ddp" / "train.expected.py", project / "train.py")
    one = shutil.copytree(project, tmp_path / "one")
    two = Launch(tmp_path, "two", on_two(project / "train.py"), cpu_env(), project)
    before = run_python(original / "train.py", cwd=original)
    alone = run_python(one / "train.py", cwd=one)
    assert before.returncode == 0 and alone.stdout == before.stdout, alone.stderr  # a world of one
    two.wait().succeeded()
    expected, trained = torch.load(original / "regressor.pt"), torch.load(project / "regressor.pt")
    assert max((expected[k] - trained[k]).abs().max().item() for k in expected) <= ONE_PROCESS_TOLERANCE
    assert len(two.stdout.splitlines()) == len(before.stdout.splitlines()), two.stdout  # printed once, by rank 0
