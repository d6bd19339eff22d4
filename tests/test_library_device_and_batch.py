"""accelerate and fabric where the device and the batch are the script's:

- a script that places nothing on a device and evaluates on data no
  prepared loader yields (a tensor made at import, a test loader left as it
  is): prepared, the model would run on each process's GPU while that data
  stays on the CPU, a device mismatch at the first evaluation on a GPU.
  Refused (AM827/AM927) with the step; the script with that step taken
  migrates, and on this CPU its copy prints what the original prints;
- a training loop that shapes its tensors with the loader's batch size
  (`x.view(batch_size, -1)`): each process holds its share of the batch, so
  the size becomes `batch_size // accelerator.num_processes` (AM832/AM932);
  2 gloo processes end on the one-process weights."""

from __future__ import annotations

import subprocess
import sys

import pytest

from accelmigrate.engine.migrate import migrate_source
from conftest import FIXTURES, PARITY
from launching import Launch, cpu_env, on_two

HOST_DATA = (FIXTURES / "accelerate" / "refused_evaluation_on_host_data.py").read_text()
REFUSAL = {"accelerate": "AM827", "fabric": "AM927"}


def with_a_device(source: str) -> str:
    """The refusal's step, as a user takes it: a device, the model and each batch it is given on it."""
    source = source.replace("torch.manual_seed(0)\n", 'torch.manual_seed(0)\ndevice = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n')
    source = source.replace("nn.Linear(16, 1))", "nn.Linear(16, 1)).to(device)")
    source = source.replace("    for xb, yb in loader:\n", "    for xb, yb in loader:\n        xb, yb = xb.to(device), yb.to(device)\n")
    return source.replace("net(held_out), held_out_labels)", "net(held_out.to(device)), held_out_labels.to(device))")


@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_evaluation_on_host_data_is_refused_with_the_step(word):
    result = migrate_source(HOST_DATA, [(word, {})], "train.py")
    assert result.code == HOST_DATA
    (finding,) = result.findings
    assert finding.code == REFUSAL[word] and not finding.fixed
    assert "`net(held_out)` evaluates the model on data this script keeps on the CPU" in finding.message
    assert '`device = torch.device("cuda" if torch.cuda.is_available() else "cpu")`' in finding.message


@pytest.mark.slow
@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_with_the_step_taken_the_copy_prints_the_originals_numbers(tmp_path, word):
    source = with_a_device(HOST_DATA)
    result = migrate_source(source, [(word, {})], "train.py")
    assert not [f for f in result.findings if not f.fixed and f.code == REFUSAL[word]]
    assert result.code != source
    printed = []
    for name, text in (("original.py", source), ("migrated.py", result.code)):
        (tmp_path / name).write_text(text)
        done = subprocess.run([sys.executable, name], capture_output=True, text=True, cwd=tmp_path, env=cpu_env(), timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        printed.append([[float(x) for x in line.split()] for line in done.stdout.splitlines()])
    assert len(printed[0]) == 3 and len(printed[1]) == 3
    assert max(abs(a - b) for old, new in zip(*printed) for a, b in zip(old, new)) <= 1e-6


VIEWED = """\
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

batch_size = 16
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
data = TensorDataset(torch.randn(128, 2, 4), torch.randn(128, 1))
loader = DataLoader(data, batch_size=batch_size, drop_last=True)
model = nn.Linear(8, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        noise = torch.zeros(batch_size, 1, device=device)
        loss = nn.functional.mse_loss(model(x.view(batch_size, -1)) + noise, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
torch.save([p.detach().cpu() for p in model.parameters()], sys.argv[1])
"""
PER_PROCESS = {"accelerate": "accelerator.num_processes", "fabric": "fabric.world_size"}


@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_shapes_sized_by_the_batch_take_this_processs_share(word):
    result = migrate_source(VIEWED, [(word, PARITY)], "train.py")
    share = f"batch_size // {PER_PROCESS[word]}"
    assert f"x.view({share}, -1)" in result.code
    assert f"torch.zeros({share}, 1, device=device)" in result.code
    assert [f.code for f in result.findings if f.code.endswith("32")] == [REFUSAL[word][:3] + "32"] * 2
    # By default each process loads the loader's batch size: the shapes stay as written.
    default = migrate_source(VIEWED, [(word, {})], "train.py")
    assert "x.view(batch_size, -1)" in default.code and not [f for f in default.findings if f.code.endswith("32")]


@pytest.mark.slow
@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_two_processes_end_on_the_one_process_weights(tmp_path, word):
    import torch

    (tmp_path / "original.py").write_text(VIEWED)
    (tmp_path / "migrated.py").write_text(migrate_source(VIEWED, [(word, PARITY)], "train.py").code)
    done = subprocess.run([sys.executable, "original.py", "original.pt"], capture_output=True, text=True, cwd=tmp_path, env=cpu_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    Launch(tmp_path, "two", on_two(tmp_path / "migrated.py", "migrated.pt"), cpu_env(), tmp_path).wait().succeeded()
    original, migrated = torch.load(tmp_path / "original.pt"), torch.load(tmp_path / "migrated.pt")
    assert max((a - b).abs().max().item() for a, b in zip(original, migrated)) <= 1e-5
