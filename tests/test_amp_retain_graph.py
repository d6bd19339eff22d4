"""`loss.backward(retain_graph=...)` under amp: each loss is scaled by the
one scaler and the keyword is kept (PyTorch's AMP examples, several losses);
the migrated two-loss step trains as the original did."""

import pytest

from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES, run_python
from test_amp_trust import assert_trains_as_before, with_stubs

TWO_LOSSES = FIXTURES / "amp" / "retain_graph_two_losses.py"


@pytest.mark.slow
def test_two_losses_through_one_retained_graph_train_as_before(tmp_path):
    """fp32 by default: the original's output exactly; bf16 and fp16 (the
    GradScaler scales both backwards, unscales before clipping): within 3%."""
    env = with_stubs(tmp_path)
    original = run_python(TWO_LOSSES, env=env, cwd=tmp_path)
    migration = migrate_source(TWO_LOSSES.read_text(encoding="utf-8"), [("amp", {})], str(TWO_LOSSES))
    assert "scaler.scale(fit).backward(retain_graph=True)" in migration.code
    script = tmp_path / TWO_LOSSES.name
    script.write_text(migration.code, encoding="utf-8")
    assert_trains_as_before(original, script, env=env)


def test_the_graph_is_really_needed_twice(tmp_path):
    """Without retain_graph the original fails: the test above exercises the keyword."""
    script = tmp_path / "no_retain.py"
    script.write_text(TWO_LOSSES.read_text(encoding="utf-8").replace("fit.backward(retain_graph=True)", "fit.backward()"), encoding="utf-8")
    completed = run_python(script)
    assert completed.returncode != 0 and "backward through the graph a second time" in completed.stderr
