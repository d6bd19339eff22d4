"""batch-scale=K and `find_max_batch_size`.

The codemod: usage errors, both values scaled in the migrated source, and the
migrated script runs with the scaled batch and learning rate. The runtime
helper: a fake step that raises `torch.OutOfMemoryError` above a threshold
(halving, then binary search), and a real 2-process gloo group whose ranks
have different thresholds and must agree on the smaller.
"""

import math
import os
import re
import sys
import textwrap

import pytest
import torch
from libcst.codemod import CodemodContext

from accelmigrate.codemods.batch_scale import BatchScale
from accelmigrate.engine.migrate import migrate_source
from accelmigrate.runtime.batch import find_max_batch_size, is_out_of_memory

from conftest import SCRIPTS, run_launch, run_python

INVALID = [{}, {"value": ""}, {"value": "x2"}, {"value": "0.5"}, {"value": "1"}, {"value": "-3"}]


@pytest.mark.parametrize("options", INVALID)
def test_missing_or_invalid_value_is_a_usage_error(options):
    with pytest.raises(ValueError, match=r"batch-scale"):
        BatchScale(CodemodContext(), options)


def migrated_script(tmp_path, scale: str):
    source = (SCRIPTS / "accum_batch_scale.py").read_text()
    result = migrate_source(source, [("batch-scale", {"value": scale})], "accum_batch_scale.py")
    path = tmp_path / "accum_batch_scale.py"
    path.write_text(result.code)
    return path, result


def test_batch_size_and_learning_rate_are_scaled_in_the_source(tmp_path):
    _, result = migrated_script(tmp_path, "4")
    assert "BATCH_SCALE = 4  #" in result.code
    assert 'parser.add_argument("--batch-size", type=int, default=16 * BATCH_SCALE)' in result.code
    assert 'parser.add_argument("--lr", type=float, default=0.01 * BATCH_SCALE)' in result.code
    assert [(f.code, f.fixed) for f in result.findings] == [("AM610", True), ("AM611", True)]
    again = migrate_source(result.code, [("batch-scale", {"value": "4"})])
    assert again.code == result.code and again.findings == []


def test_a_large_factor_recommends_a_warm_up(tmp_path):
    _, result = migrated_script(tmp_path, "16")
    assert [f.code for f in result.findings] == ["AM610", "AM611", "AM613"]


def printed(done, label: str) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return next(line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith(label))


@pytest.mark.slow
def test_migrated_script_runs_with_the_scaled_values(tmp_path):
    path, _ = migrated_script(tmp_path, "4")
    original = run_python(SCRIPTS / "accum_batch_scale.py", env={"OMP_NUM_THREADS": "1"})
    migrated = run_python(path, env={"OMP_NUM_THREADS": "1"})
    assert printed(original, "batch size") == "16" and float(printed(original, "learning rate")) == pytest.approx(0.01)
    assert printed(migrated, "batch size") == "64" and float(printed(migrated, "learning rate")) == pytest.approx(0.04)
    assert math.isfinite(float(printed(migrated, "final loss")))


# -- find_max_batch_size ------------------------------------------------------------


class FakeStep:
    """A training step that runs out of memory above `limit` samples."""

    def __init__(self, limit: int, error=torch.OutOfMemoryError):
        self.limit, self.error, self.tried = limit, error, []

    def __call__(self, batch_size: int) -> None:
        self.tried.append(batch_size)
        if batch_size > self.limit:
            raise self.error(f"CUDA out of memory. Tried to allocate {batch_size} MiB")


@pytest.mark.parametrize("limit", [1, 2, 7, 100, 300, 511, 512, 513, 1000, 1023])
def test_finds_the_largest_batch_that_fits(limit):
    step = FakeStep(limit)
    assert find_max_batch_size(step, start=1024) == limit
    assert len(step.tried) <= math.log2(1024) + 1


def test_halves_then_binary_searches():
    step = FakeStep(300)
    assert find_max_batch_size(step, start=1024) == 300
    assert step.tried == [1024, 512, 256, 384, 320, 288, 304, 296, 300, 302, 301]


def test_start_that_fits_is_the_answer():
    step = FakeStep(5000)
    assert find_max_batch_size(step, start=1024) == 1024
    assert step.tried == [1024]


def test_nothing_fits():
    with pytest.raises(RuntimeError, match="even a batch of"):
        find_max_batch_size(FakeStep(3), start=64, minimum=4)


def test_out_of_memory_as_a_plain_runtime_error():
    """MPS and older releases raise a RuntimeError saying "out of memory"."""
    assert find_max_batch_size(FakeStep(40, error=RuntimeError), start=64) == 40


def test_other_errors_propagate():
    def broken(batch_size):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        find_max_batch_size(broken, start=8)


def test_is_out_of_memory():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("MPS backend out of memory"))
    assert not is_out_of_memory(ValueError("out of memory"))
    assert not is_out_of_memory(RuntimeError("expected scalar type"))


RANKS_SCRIPT = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist

    from accelmigrate.runtime.batch import find_max_batch_size

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    limit = {0: 100, 1: 37}[rank]
    tried = []

    def step(batch_size):
        tried.append(batch_size)
        if batch_size > limit:
            raise torch.OutOfMemoryError(f"rank {rank}: out of memory at {batch_size}")

    found = find_max_batch_size(step, start=256)
    print(f"rank {rank} found {found} after {len(tried)} trials")
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_ranks_agree_on_the_smallest_limit(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = run_launch(command, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # Both ranks print to one pipe, where one line may run into the other.
    results = sorted(re.findall(r"rank \d found \d+ after \d+ trials", done.stdout))
    expected_trials = len(_single_process_trials(37, 256))
    assert results == [f"rank 0 found 37 after {expected_trials} trials", f"rank 1 found 37 after {expected_trials} trials"]


def _single_process_trials(limit: int, start: int) -> list:
    step = FakeStep(limit)
    find_max_batch_size(step, start=start)
    return step.tried


def test_a_loader_alias_is_followed_to_the_training_loader():
    """`loader = train_loader` with a test loader beside it: the model follows
    the alias, so the training loader is scaled instead of the file being
    refused for having two loaders (AM612)."""
    source = textwrap.dedent(
        """\
        import torch
        from torch.utils.data import DataLoader

        train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
        test_loader = DataLoader(test_set, batch_size=256)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = train_loader
        for x, y in loader:
            optimizer.zero_grad()
            model(x, y).backward()
            optimizer.step()
        """
    )
    result = migrate_source(source, [("batch-scale", {"value": "2"})])
    assert [(f.line, f.code) for f in result.findings] == [(4, "AM610"), (6, "AM611")]
    assert "DataLoader(train_set, batch_size=64 * BATCH_SCALE, shuffle=True)" in result.code
    assert "DataLoader(test_set, batch_size=256)" in result.code and "lr=0.1 * BATCH_SCALE" in result.code
