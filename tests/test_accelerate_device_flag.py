"""A `--device` flag and a model that places what it builds on its input's own
device (fixtures/accelerate/device_flag_and_a_tensors_own_device.py):
`device = x.device` in `forward` reads a tensor, not the parsed arguments, so
it is neither a device the script chooses nor a read of the flag; the flag's
one read in main() becomes `accelerator.device`, and two gloo processes end
on the one-process weights."""

from __future__ import annotations

import libcst as cst
import pytest

from accelmigrate.codemods.script.model import ScriptModel
from accelmigrate.engine.migrate import migrate_source
from conftest import FIXTURES, exact_options
from test_ddp_param_groups import expected_pair_parity

CASE = FIXTURES / "accelerate" / "device_flag_and_a_tensors_own_device.py"


def test_a_tensors_own_device_is_no_device_the_script_chooses():
    devices = ScriptModel.of(cst.parse_module(CASE.read_text())).devices
    assert [(d.name, d.kind) for d in devices] == [("--device", "flag"), ("args.device", "parsed"), ("device", "string")]
    assert [d.scope.name for d in devices if d.name == "device"] == ["main"]


@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_the_flags_one_read_becomes_the_process_device(word):
    result = migrate_source(CASE.read_text(), [(word, exact_options(word))], CASE.name)
    assert [f.code for f in result.findings if not f.fixed and f.code not in ("AM811", "AM911")] == []
    assert f"    device = {'accelerator' if word == 'accelerate' else 'fabric'}.device\n" in result.code
    assert "        device = x.device\n" in result.code


@pytest.mark.slow
def test_two_processes_end_with_the_one_process_weights(tmp_path):
    parity = expected_pair_parity(CASE, tmp_path, "accelerate")
    assert parity.verdict == "same", parity.why
