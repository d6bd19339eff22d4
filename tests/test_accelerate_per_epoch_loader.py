"""A training DataLoader made anew at the top of every epoch
(fixtures/accelerate/loader_made_each_epoch.py): accelerate prepares it where
it is made, each time (`loader = accelerator.prepare(loader)`), and the model
and optimizer once before the epoch loop; two gloo processes end on the
one-process weights (the main process draws each epoch's order, as the
original does). fabric refuses it: set up anew each epoch, its sampler would
start from epoch 0 every time and draw one order for every epoch."""

from __future__ import annotations

import pytest

from accelmigrate.engine.migrate import migrate_source
from conftest import FIXTURES, PARITY
from test_ddp_param_groups import expected_pair_parity

CASE = FIXTURES / "accelerate" / "loader_made_each_epoch.py"


def test_the_loader_is_prepared_where_it_is_made_and_the_rest_once():
    code = CASE.with_name(f"{CASE.stem}.expected.py").read_text()
    assert "    model, optimizer = accelerator.prepare(model, optimizer)\n    for epoch in range(3):\n" in code
    assert "        loader = DataLoader(dataset, batch_size=12, shuffle=True)\n        loader = accelerator.prepare(loader)\n" in code


def test_fabric_refuses_a_loader_made_each_epoch():
    source = CASE.read_text()
    result = migrate_source(source, [("fabric", PARITY)], CASE.name)
    assert result.code == source
    assert any(f.code == "AM920" and "bound inside or after the training loop" in f.message for f in result.findings)


@pytest.mark.slow
def test_two_processes_end_with_the_one_process_weights(tmp_path):
    parity = expected_pair_parity(CASE, tmp_path, "accelerate")
    assert parity.verdict == "same", parity.why
