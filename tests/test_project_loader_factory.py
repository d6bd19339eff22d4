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

from conftest import FIXTURES, exact, run_python
from launching import ONE_PROCESS_TOLERANCE, Launch, cpu_env, on_two
from test_cli import invoke

PROJECT = FIXTURES / "projects" / "loader_factory"


def migrated(folder, word):
    project = shutil.copytree(PROJECT, folder)
    done = invoke("apply", "--to", exact(word), "--no-cache", "train.py", cwd=project)
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


PADDED = '''

def pad_collate(padding_value):
    def collate(samples):
        inputs = pad_sequence([x.unsqueeze(1) for x, _ in samples], padding_value=padding_value{flag})
        return inputs, torch.stack([y for _, y in samples])

    return collate
'''


@pytest.mark.parametrize("batch_first", [False, True])
def test_accelerate_refuses_a_returned_loader_padded_time_first(tmp_path, batch_first):
    """A batch accelerate dispatches from rank 0 is cut along its first dimension: time steps, for a loader
    whose collate function (here the closure a factory of data.py returns) pads with `pad_sequence` time-first."""
    project = shutil.copytree(PROJECT, tmp_path / "project")
    data = project / "data.py"
    data.write_text(
        data.read_text().replace("from torch.utils.data import", "from torch.nn.utils.rnn import pad_sequence\nfrom torch.utils.data import")
        .replace("shuffle=True)", "shuffle=True, collate_fn=pad_collate(0.0))")
        + PADDED.format(flag=", batch_first=True" if batch_first else "")
    )
    before = {path.name: path.read_text() for path in project.glob("*.py")}
    done = invoke("apply", "--to", "accelerate=parity", "--no-cache", "train.py", cwd=project)
    after = {path.name: path.read_text() for path in project.glob("*.py")}
    if batch_first:
        assert done.exit_code == 0, done.output
        assert "accelerator.prepare(model, optimizer, loader)" in after["train.py"]
    else:
        assert after == before
        assert "train.py:10:14: AM829 `make_loader` returns training batches padded time-first" in done.output, done.output
