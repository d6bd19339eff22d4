"""`accelmigrate verify --to accelerate`: the migrated copy on 2 CPU processes
(torchrun, gloo, ACCELERATE_USE_CPU=true set by verify) against the original
in one: the mean of the ranks' losses is the original's at every step (each
rank's loss is the mean over its half of the global batch), and every rank
ends each step with the same weights. A flat script, and one whose loss sums
over the batch (the migrated backward multiplies by the number of processes),
unshuffled and shuffled (rank 0 draws the original's order and dispatches
each rank its half of every batch).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCRIPTS, run_verify


pytestmark = pytest.mark.slow

SUMMED_LOSS = '''\
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(96, 6)
y = x @ torch.randn(6, 2)
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False)
model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.002)
criterion = torch.nn.MSELoss(reduction="sum")
for epoch in range(2):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = criterion(model(xb), yb)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
'''


def test_flat_script_on_two_processes_matches_one(tmp_path: Path):
    script = tmp_path / "ddp_plain_flat.py"
    script.write_text((SCRIPTS / "ddp_plain_flat.py").read_text())
    code, result = run_verify(str(script), "--to", "accelerate=parity", "--steps", "4", "--", str(tmp_path))
    assert code == 0, result
    assert result["processes"] == 2
    assert result["verdict"] == "same"


@pytest.mark.parametrize("shuffle", [False, True])
def test_loss_summed_over_the_batch_on_two_processes_matches_one(tmp_path: Path, shuffle: bool):
    script = tmp_path / "summed.py"
    script.write_text(SUMMED_LOSS.replace("shuffle=False", f"shuffle={shuffle}"))
    code, result = run_verify(str(script), "--to", "accelerate=parity", "--steps", "6")
    assert code == 0, result
    assert result["processes"] == 2
    assert result["verdict"] == "same"


@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_by_default_two_processes_train_as_the_original_with_twice_the_batch(tmp_path: Path, word: str):
    """Accelerate's and Fabric's defaults: each rank loads the loader's batch size, so verify compares the 2
    processes with the original at twice the batch, step for step; shuffled, the sampler's order differs from the
    original's, and verify names the migration's note for it."""
    script = tmp_path / "summed.py"
    script.write_text(SUMMED_LOSS)
    code, result = run_verify(str(script), "--to", word, "--steps", "4")
    assert code == 0, result
    assert (result["processes"], result["reference_batch_scale"], result["verdict"]) == (2, 2, "same")
    script.write_text(SUMMED_LOSS.replace("shuffle=False", "shuffle=True"))
    code, result = run_verify(str(script), "--to", word, "--steps", "4")
    assert result["verdict"] == "differ", result
    assert ("AM835" if word == "accelerate" else "AM910") in result["expected"]
