"""A checkpoint that rank 0 alone writes, read back by every rank in a
function called after the write (fixtures/ddp/best_weights_reloaded_by_a_test_function.py:
`train` saves the best weights, then calls `test`, which reloads them):
every rank waits at a `barrier()` before the read, and two gloo processes
end on the one-process weights, those of the best epoch."""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from test_ddp_param_groups import expected_pair_parity

CASE = FIXTURES / "ddp" / "best_weights_reloaded_by_a_test_function.py"


def test_the_read_waits_for_rank_zeros_write():
    migrated = CASE.with_name(f"{CASE.stem}.expected.py").read_text()
    test_function = migrated[migrated.index("def test("):migrated.index("def train(")]
    assert test_function.index("barrier()") < test_function.index("torch.load(CHECKPOINT")


@pytest.mark.slow
def test_two_processes_reload_the_best_weights_rank_zero_saved(tmp_path):
    parity = expected_pair_parity(CASE, tmp_path)
    assert parity.verdict == "same", parity.why
