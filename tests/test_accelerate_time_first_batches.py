"""Batches padded time-first (fixtures/accelerate/padded_sequences_time_first.py:
`pad_sequence` without `batch_first=True`, in the collate function a factory
returns). Accelerate dispatches a shuffled training loader's batches from
rank 0 and cuts each along its first dimension: that would give every process
a stretch of time steps of every sequence, so a shuffled loader padded
time-first is refused (AM829 at the padding). Unshuffled, each process
collates its own samples: migrated, and two gloo processes end on the
one-process weights; padded batch-first and shuffled, it is dispatched, and
ends there too."""

from __future__ import annotations

import pytest

from accelmigrate.engine.migrate import migrate_source
from conftest import FIXTURES, PARITY
from test_ddp_param_groups import expected_pair_parity, parity_on_two

CASE = FIXTURES / "accelerate" / "padded_sequences_time_first.py"
SHUFFLED = ("batch_size=8, collate_fn", "batch_size=8, shuffle=True, collate_fn")
BATCH_FIRST = ("padding_value=padding_value)", "padding_value=padding_value, batch_first=True)")


def _migrate(source: str):
    return migrate_source(source, [("accelerate", PARITY)], CASE.name)


def test_a_shuffled_loader_padded_time_first_is_refused_at_its_padding():
    source = CASE.read_text().replace(*SHUFFLED)
    result = _migrate(source)
    assert result.code == source
    refused = [f for f in result.findings if f.code == "AM829"]
    assert [f.line for f in refused] == [source.splitlines().index("        inputs = pad_sequence([s for s, _ in samples], padding_value=padding_value)") + 1]
    assert "time-first" in refused[0].message and "batch_first=True" in refused[0].message


def test_padded_batch_first_a_shuffled_loader_is_dispatched():
    code = _migrate(CASE.read_text().replace(*SHUFFLED).replace(*BATCH_FIRST)).code
    assert "dispatch_batches=True" in code and "accelerator.prepare(model, optimizer, loader)" in code


@pytest.mark.slow
def test_unshuffled_two_processes_end_with_the_one_process_weights(tmp_path):
    parity = expected_pair_parity(CASE, tmp_path, "accelerate")
    assert parity.verdict == "same", parity.why


@pytest.mark.slow
def test_shuffled_and_batch_first_two_processes_end_with_the_one_process_weights(tmp_path):
    source = CASE.read_text().replace(*SHUFFLED).replace(*BATCH_FIRST).replace("outputs[-1]", "outputs[:, -1]").replace(
        "nn.GRU(2, 6)", "nn.GRU(2, 6, batch_first=True)"
    )
    parity = parity_on_two(source, _migrate(source).code, CASE.name, tmp_path, "accelerate")
    assert parity.verdict == "same", parity.why
