"""A training DataLoader that a function of the script makes
(fixtures/accelerate/loader_made_by_a_function_of_the_script.py:
`train_loader = make_loader(features, targets, batch_size, shuffle=True)`).
Accelerate prepares it where the script receives it and dispatches its
batches from the main process (its settings come through the function's
parameters, so whether it shuffles is not read), and two gloo processes end on
the one-process weights. A name passed to the function that shapes a tensor
in the loop may be the batch size, now split: refused. Fabric would set the
per-process batch size where the loader is made: refused."""

from __future__ import annotations

import pytest

from accelmigrate.engine.migrate import migrate_source
from conftest import FIXTURES, exact_options
from test_ddp_param_groups import expected_pair_parity

CASE = FIXTURES / "accelerate" / "loader_made_by_a_function_of_the_script.py"


def _migrate(source: str, word: str = "accelerate"):
    return migrate_source(source, [(word, exact_options(word))], CASE.name)


def test_the_loader_is_prepared_where_the_script_receives_it_and_dispatched():
    result = _migrate(CASE.read_text())
    assert [f.code for f in result.findings if not f.fixed] == ["AM811"]
    assert "model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)" in result.code
    assert "dispatch_batches=True" in result.code
    assert any(f.code == "AM810" and "made by `make_loader`" in f.message for f in result.findings)


def test_a_name_passed_to_the_function_that_shapes_a_tensor_in_the_loop_is_refused():
    source = CASE.read_text().replace("loss = nn.functional.mse_loss(model(inputs), wanted)", "loss = nn.functional.mse_loss(model(inputs).view(batch_size, 1), wanted)")
    result = _migrate(source)
    assert result.code == source
    assert any(f.code == "AM829" and "`batch_size`, passed to `make_loader`" in f.message for f in result.findings)


def test_fabric_refuses_it():
    source = CASE.read_text()
    result = _migrate(source, "fabric")
    assert result.code == source
    assert any(f.code == "AM929" and "made by `make_loader`" in f.message for f in result.findings)


@pytest.mark.slow
def test_two_processes_end_with_the_one_process_weights(tmp_path):
    parity = expected_pair_parity(CASE, tmp_path, "accelerate")
    assert parity.verdict == "same", parity.why
