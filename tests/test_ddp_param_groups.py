"""ddp finds the model an optimizer trains through parameter groups as real
scripts write them: lists the model keeps of its own parameters
(`{"params": model.body_params}`) and lists built in a loop over
`model.named_parameters()` (biases apart). The migrated copies, launched on 2
gloo processes, end with the weights of the original in one process."""

import importlib.util
import sys
from pathlib import Path

import pytest

from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES, PARITY, exact

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "reach.py"
_spec = importlib.util.spec_from_file_location("reach_benchmark", _PATH)
reach = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
if not hasattr(reach, "parity_on_two"):
    _spec.loader.exec_module(reach)

CASES = ["param_groups_model_attributes", "param_groups_built_in_a_loop"]


def expected_pair_parity(case: Path, tmp_path: Path, word: str = "ddp"):
    """A fixture pair (`case` and its `.expected.py`), the expected launched on 2 gloo processes against the case on
    one; for accelerate and fabric, whose fixtures show their default forms, the case migrated with exact parity."""
    source = case.read_text()
    if word in ("accelerate", "fabric"):
        migrated = migrate_source(source, [(word, PARITY)], case.name).code
    else:
        migrated = case.with_name(f"{case.stem}.expected.py").read_text()
    return parity_on_two(source, migrated, case.name, tmp_path, word)


def parity_on_two(source: str, migrated: str, name: str, tmp_path: Path, word: str = "ddp"):
    """`migrated` (a `word` migration of `source`) launched on 2 gloo processes against `source` on one."""
    original, copy = tmp_path / "original" / name, tmp_path / "copy" / name
    for path, text in ((original, source), (copy, migrated)):
        path.parent.mkdir()
        path.write_text(text)
    return reach.parity_on_two(original, copy, tmp_path / "runs", reach.MULTI_PROCESS.get(exact(word)))


@pytest.mark.parametrize("case", CASES)
def test_the_trained_model_is_wrapped(case):
    source = (FIXTURES / "ddp" / f"{case}.py").read_text()
    code = migrate_source(source, [("ddp", {})], f"{case}.py").code
    assert "model = DistributedDataParallel(model, device_ids=ddp_device_ids(model))" in code
    assert "AM520" not in {f.code for f in migrate_source(source, [("ddp", {})], f"{case}.py").findings}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_two_processes_end_with_the_one_process_weights(case, tmp_path):
    original = tmp_path / "original" / f"{case}.py"
    copy = tmp_path / "copy" / f"{case}.py"
    for path in (original, copy):
        path.parent.mkdir()
    source = (FIXTURES / "ddp" / f"{case}.py").read_text()
    original.write_text(source)
    copy.write_text(migrate_source(source, [("ddp", {})], copy.name).code)
    parity = reach.parity_on_two(original, copy, tmp_path / "runs")
    assert parity.verdict == "same", parity.why
