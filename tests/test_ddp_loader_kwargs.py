"""A training DataLoader given `**kwargs` that hold only worker settings (the
VAE example's `{"num_workers": 1, "pin_memory": True} if args.cuda else {}`)
is sharded by ddp: the migrated script runs alone with the original's final
loss, and on two processes (gloo) prints it once.

A training DataLoader whose dict holds its batch size and `shuffle=`
(fixtures/ddp/loader_kwargs_update.py, `.update()`d as the classic examples
do) gets `**sharded_loader_kwargs(dataset, kwargs)`, and one a trainer class
keeps as `self.train_loader` (fixtures/ddp/trainer_loader_attribute.py) its
sampler and set_epoch: alone, each prints the original's final loss; on 2
gloo processes both ranks end with the one-process weights."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

from accelmigrate.codemods import parse_words, resolve
from accelmigrate.engine.migrate import plan_of, process_file

from conftest import FIXTURES, run_launch
from launching import ONE_PROCESS_TOLERANCE, RANK_TOLERANCE, RANK_WEIGHTS, cpu_env, largest_parameter_difference, rank_weights

VAE = Path(__file__).resolve().parent.parent / "benchmarks" / "reach" / "vae_mnist_shape.py"
FINAL = re.compile(r"^final loss: (\S+)$", re.MULTILINE)


def _final_losses(command: list, folder: Path) -> list:
    done = run_launch(command, cwd=folder, env=cpu_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return [float(x) for x in FINAL.findall(done.stdout)]


def test_loader_with_worker_kwargs_is_sharded_and_runs(tmp_path):
    result = process_file(str(VAE), plan_of(resolve(parse_words("ddp"))))
    assert result.error is None
    assert "AM523" not in [f.code for f in result.findings]
    assert "sampler=SeededDistributedSampler(" in result.migrated
    migrated = tmp_path / VAE.name
    migrated.write_text(result.migrated)

    (original,) = _final_losses([sys.executable, str(VAE)], tmp_path)
    (alone,) = _final_losses([sys.executable, str(migrated)], tmp_path)
    assert math.isclose(original, alone, rel_tol=0, abs_tol=1e-6)
    on_two = _final_losses([sys.executable, "-m", "accelmigrate", "run", "--nproc-per-node", "2", str(migrated)], tmp_path)
    assert len(on_two) == 1 and math.isfinite(on_two[0])


@pytest.mark.slow
@pytest.mark.parametrize("case", ["loader_kwargs_update", "trainer_loader_attribute"])
def test_sharded_loader_trains_as_the_original(tmp_path, case):
    original = FIXTURES / "ddp" / f"{case}.py"
    result = process_file(str(original), plan_of(resolve(parse_words("ddp"))))
    assert result.error is None and "AM523" not in [f.code for f in result.findings]
    assert "set_epoch(epoch)" in result.migrated
    migrated = tmp_path / original.name
    migrated.write_text(result.migrated)
    (one,) = _final_losses([sys.executable, str(original)], tmp_path)
    (alone,) = _final_losses([sys.executable, str(migrated)], tmp_path)
    assert one == alone
    folders = {name: tmp_path / name for name in ("original", "ddp")}
    for folder in folders.values():
        folder.mkdir()
    _final_losses([sys.executable, str(RANK_WEIGHTS), str(folders["original"]), str(original)], tmp_path)
    two = [sys.executable, "-m", "accelmigrate", "run", "--nproc-per-node", "2", "--force", str(RANK_WEIGHTS), "--", str(folders["ddp"]), str(migrated)]
    done = run_launch(two, cwd=tmp_path, env=cpu_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = rank_weights(folders["ddp"])
    assert len(ranks) == 2 and largest_parameter_difference(*ranks) <= RANK_TOLERANCE
    (weights,) = rank_weights(folders["original"])
    assert largest_parameter_difference(weights, ranks[0]) <= ONE_PROCESS_TOLERANCE
