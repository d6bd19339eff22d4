"""`accelmigrate verify --to fabric`: the migrated copy on 2 CPU processes
(torchrun, gloo; the migrated Fabric reads torchrun's LOCAL_WORLD_SIZE and
WORLD_SIZE, so verify sets nothing) against the original in one: the mean of
the ranks' losses is the original's at every step (each rank loads half of
the global batch through Fabric's DistributedSampler), and every rank ends
each step with the same weights. A flat script, and one whose loss sums over
the batch (the migrated backward multiplies by `fabric.world_size`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCRIPTS
from test_accelerate_verify import SUMMED_LOSS, run_verify

pytestmark = pytest.mark.slow


def test_flat_script_on_two_processes_matches_one(tmp_path: Path):
    script = tmp_path / "ddp_plain_flat.py"
    script.write_text((SCRIPTS / "ddp_plain_flat.py").read_text())
    code, result = run_verify(str(script), "--to", "fabric=parity", "--steps", "4", "--", str(tmp_path))
    assert code == 0, result
    assert result["processes"] == 2
    assert result["verdict"] == "same"


def test_loss_summed_over_the_batch_on_two_processes_matches_one(tmp_path: Path):
    script = tmp_path / "summed.py"
    script.write_text(SUMMED_LOSS)  # unshuffled: each step trains on the original's batch
    code, result = run_verify(str(script), "--to", "fabric=parity", "--steps", "6")
    assert code == 0, result
    assert result["processes"] == 2
    assert result["verdict"] == "same"
