"""A script whose own training loop iterates a DataLoader that a function of
another module of the project builds and returns
(fixtures/projects/loader_factory: `loader = make_loader(batch_size=12)`
from data.py): ddp shards it where it is built (data.py gets the sampler
and the per-process batch size, train.py `set_loader_epoch`), accelerate
prepares it where the script receives it (its batches dispatched from the
main process: whether it shuffles is not seen from the script). Both end on
2 gloo processes with the one-process weights and print once."""

from __future__ import annotations

import shutil

import pytest
import torch

from conftest import FIXTURES, run_python
from launching import ONE_PROCESS_TOLERANCE, Launch, cpu_env, on_two
from test_cli import invoke

PROJECT = FIXTURES / "projects" / "loader_factory"


def migrated(folder, word):
    project = shutil.copytree(PROJECT, folder)
    done = invoke("apply", "--to", word, "--no-cache", "train.py", cwd=project)
    assert done.exit_code == 0, done.output
    return project


def test_ddp_shards_the_loader_where_it_is_built(tmp_path):
    project = migrated(tmp_path / "ddp", "ddp")
    assert "sampler=SeededDistributedSampler(dataset, shuffle=True)" in (project / "data.py").read_text()
    assert "set_loader_epoch(loader, epoch)" in (project / "train.py").read_text()
    assert invoke("check", "--to", "ddp", "--no-cache", "train.py", cwd=project).exit_code == 0


def test_accelerate_prepares_the_loader_where_the_script_receives_it(tmp_path):
    project = migrated(tmp_path / "accelerate", "accelerate")
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in (project / "train.py").read_text()
    assert (project / "data.py").read_text() == (PROJECT / "data.py").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("word", ["ddp", "accelerate"])
def test_two_processes_end_with_the_one_process_weights(tmp_path, word):
    original = shutil.copytree(PROJECT, tmp_path / "original")
    project = migrated(tmp_path / "migrated", word)
    two = Launch(tmp_path, "two", on_two(project / "train.py"), cpu_env(ACCELERATE_USE_CPU="true"), project)
    before = run_python(original / "train.py", cwd=original)
    assert before.returncode == 0, before.stderr
    two.wait().succeeded()
    expected, trained = torch.load(original / "weights.pt"), torch.load(project / "weights.pt")
    assert max((expected[k] - trained[k]).abs().max().item() for k in expected) <= ONE_PROCESS_TOLERANCE
    assert two.stdout.count("epoch 2 done") == 1, two.stdout
