"""Batches drawn without a DataLoader, sharded by rank (`rank_share`):

- fixtures/ddp/index_slices.py: `features[start:start + B]` in a range loop
  inside train(); its last batch (7 rows) does not split across 2 ranks and
  goes whole to both;
- fixtures/ddp/index_full_batch.py: the whole data set every step;
- fixtures/ddp/index_batch_function.py: what `sample_windows()` returns,
  with the GRU's state made by the model's own method for the batch;
- fixtures/ddp/index_summed_loss.py: `reduction="sum"`, batches of 15 split
  8 and 7 (summed shares need not be equal).

Each migrated script run with plain `python` prints the original's final
loss, and on 2 gloo processes both ranks end with the one-process weights.
"""

from __future__ import annotations

import collections
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import FIXTURES, run_cli
from launching import ONE_PROCESS_TOLERANCE, RANK_WEIGHTS, Launch, assert_ranks_agree, cpu_env, largest_parameter_difference, rank_weights

CASES = FIXTURES / "ddp"
CASES_RUN = ("index_slices", "index_full_batch", "index_batch_function", "index_summed_loss")
FINAL = re.compile(r"^final loss: (\S+)$", re.MULTILINE)


def _migrate(work: Path, case: str) -> Path:
    migrated = work / f"{case}.py"
    shutil.copy(CASES / f"{case}.py", migrated)
    shutil.copy(CASES / f"{case}.py", work / f"{case}.original.py")
    applied = run_cli("apply", str(migrated), "--to", "ddp", cwd=work)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "rank_share(" in migrated.read_text()
    return migrated


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    work = tmp_path_factory.mktemp("ddp-index")
    python, env = sys.executable, cpu_env()
    plans = {}
    for case in CASES_RUN:
        migrated = _migrate(work, case)
        plans[f"{case}-original"] = [python, str(RANK_WEIGHTS), "{folder}", str(work / f"{case}.original.py")]
        plans[f"{case}-alone"] = [python, str(migrated)]
        plans[f"{case}-ddp"] = [python, "-m", "accelmigrate", "run", "--nproc-per-node", "2", "--force", str(RANK_WEIGHTS), "--", "{folder}", str(migrated)]
    folders, started = {}, {}
    for name, command in plans.items():
        folders[name] = work / name
        folders[name].mkdir()
        started[name] = Launch(work, name, [part.format(folder=folders[name]) for part in command], env, folders[name])
    return {name: launch.wait() for name, launch in started.items()}, folders


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_RUN)
def test_alone_the_migrated_script_prints_the_original_loss(launches, case):
    runs, _ = launches
    original, alone = runs[f"{case}-original"], runs[f"{case}-alone"]
    assert original.returncode == 0, original.describe()
    assert alone.returncode == 0, alone.describe()
    assert FINAL.findall(alone.stdout) == FINAL.findall(original.stdout) != []


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_RUN)
def test_two_ranks_end_with_the_one_process_weights(launches, case):
    runs, folders = launches
    weights = assert_ranks_agree(runs[f"{case}-ddp"], folders[f"{case}-ddp"])
    (original,) = rank_weights(folders[f"{case}-original"])
    assert largest_parameter_difference(original, weights) <= ONE_PROCESS_TOLERANCE


@pytest.fixture
def rank_one_of_two(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")


def test_rank_share_is_the_batch_itself_in_a_world_of_one(monkeypatch):
    from accelmigrate.runtime.distributed import rank_share

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    batch = torch.arange(5)
    assert rank_share(batch) is batch and rank_share(batch, summed=True) is batch


def test_rank_share_takes_this_ranks_rows_or_the_whole_uneven_batch(rank_one_of_two):
    from accelmigrate.runtime.distributed import rank_share

    even, uneven = torch.arange(6), torch.arange(5)
    assert rank_share(even).tolist() == [1, 3, 5]
    assert rank_share(uneven) is uneven  # a mean over unequal shares is not the batch's mean
    assert rank_share(uneven, summed=True).tolist() == [1, 3]  # a sum over disjoint shares is the batch's sum


def test_rank_share_shares_each_item_of_a_batch(rank_one_of_two):
    from accelmigrate.runtime.distributed import rank_share

    Pair = collections.namedtuple("Pair", "x y")
    x, y = torch.arange(4), torch.arange(8).view(4, 2)
    shared = rank_share(Pair(x, y))
    assert isinstance(shared, Pair) and shared.x.tolist() == [1, 3] and shared.y.tolist() == [[2, 3], [6, 7]]
    assert rank_share({"x": x, "n": 4})["x"].tolist() == [1, 3] and rank_share({"x": x, "n": 4})["n"] == 4
    assert rank_share([x, torch.tensor(2.0)])[1].item() == 2.0  # no rows: kept


def _ddp(source: str):
    from accelmigrate.engine.migrate import migrate_source

    return migrate_source(textwrap.dedent(source), [("ddp", {})], "train.py")


LOOP = """\
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    X, Y = torch.randn(64, 4), torch.randn(64, 1)
    weights = torch.ones(1)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for i in range(0, 64, 16):
            {step}
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""


def test_a_setting_passed_by_keyword_is_no_batch():
    step = "loss = nn.functional.binary_cross_entropy_with_logits(model(X[i:i + 16]), Y[i:i + 16], pos_weight=weights)"
    result = _ddp(LOOP.format(step=step))
    assert "rank_share(X[i:i + 16])" in result.code and "rank_share(Y[i:i + 16])" in result.code
    assert "rank_share(weights)" not in result.code


@pytest.mark.parametrize(
    "step, reason",
    [
        ("loss = (model(X[i:i + 16]) - Y).pow(2).mean()", "`Y` from outside the step is an operand of arithmetic"),
        ("loss = nn.functional.mse_loss(model(X[i:i + 16]), torch.zeros(16, 1))", "from nothing it reads as the batch"),
        ("loss = model(X[i:i + 16].view(16, -1)).mean()", "shapes the batch with a size it does not take from it"),
        ("loss = model(X[i:i + 16] + torch.randn(16, 4)).mean()", "a random draw in the step"),
    ],
)
def test_a_step_that_cannot_be_read_whole_is_left_as_it_was(step, reason):
    """Sharding some of a step's tensors and not the others would change what it computes."""
    result = _ddp(LOOP.format(step=step))
    assert "rank_share" not in result.code and "DistributedDataParallel(model" in result.code
    (finding,) = [f for f in result.findings if f.code == "AM521"]
    assert reason in finding.message


def test_a_migrated_step_is_not_sharded_twice():
    first = _ddp(LOOP.format(step="loss = nn.functional.mse_loss(model(X[i:i + 16]), Y[i:i + 16])"))
    second = _ddp(first.code)
    assert second.code == first.code and second.code.count("rank_share(") == 2


def test_rank_share_shares_numpy_arrays_as_tensors(rank_one_of_two):
    import numpy

    from accelmigrate.runtime.distributed import rank_share

    assert rank_share(numpy.arange(6)).tolist() == [1, 3, 5]
