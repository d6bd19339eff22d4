"""benchmarks/reach.py: the scripts with no manual step per set of words, and
`--parity`, which tells a copy of a multi-process word (ddp, accelerate,
fabric) that trains as the original on 2 gloo processes from one that does not."""

import collections
import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "reach.py"
_spec = importlib.util.spec_from_file_location("reach_benchmark", _PATH)
reach = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reach)

FLAT = reach.CORPUS / "flat_mlp_tutorial.py"


def _outcome(script: str, words: str, verdict: str, *codes: str):
    return reach.Outcome(script, words, verdict, collections.Counter(codes), True, True)


def test_only_full_scripts_have_no_manual_step():
    outcomes = [
        _outcome("a.py", "ddp", "full"),
        _outcome("b.py", "ddp", "partly", "AM521"),
        _outcome("c.py", "ddp", "broke"),
        _outcome("d.py", "ddp", "full"),
        _outcome("a.py", "checklist", "full"),
    ]
    assert reach.no_manual_step(outcomes, ["checklist", "ddp"]).splitlines() == [
        "checklist: 1 of 1 scripts with no manual step (100%)",
        "ddp: 2 of 4 scripts with no manual step (50%)",
    ]


def test_checklist_is_measured_and_keeps_the_numbers():
    assert reach.WORD_SETS["checklist"] == ("checklist", True)


def test_a_run_by_findings_ends_with_the_count_per_set_of_words(capsys):
    assert reach.main(["--no-run", "--words", "checklist", "--words", "ddp", str(FLAT)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-2:]
    assert last == [
        "checklist: 1 of 1 scripts with no manual step (100%)",
        "ddp: 1 of 1 scripts with no manual step (100%)",
    ]


def test_parity_needs_runs():
    with pytest.raises(SystemExit):
        reach.main(["--no-run", "--parity", str(FLAT)])


def test_weights_of_other_shapes_are_not_compared():
    import torch

    assert reach._largest_difference([torch.zeros(2)], [torch.zeros(3)]) is None
    assert reach._largest_difference([torch.zeros(2)], [torch.tensor([0.0, 0.5])]) == 0.5


def test_copies_carry_plain_definitions_unless_the_runtime_is_asked_for(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "runtime").mkdir()
    plain, _, wrong = reach.migrate(FLAT, "ddp", tmp_path / "plain")
    assert not wrong and "accelmigrate" not in plain.read_text() and "def init_distributed():" in plain.read_text()
    kept, _, wrong = reach.migrate(FLAT, "ddp", tmp_path / "runtime", runtime=True)
    assert not wrong and "from accelmigrate.runtime.distributed import" in kept.read_text()


@pytest.mark.slow
def test_the_ddp_copy_on_two_processes_ends_with_the_one_process_weights(tmp_path):
    copy, _, wrong = reach.migrate(FLAT, "ddp", tmp_path)
    assert not wrong and "DistributedDataParallel" in copy.read_text()
    parity = reach.parity_on_two(FLAT, copy, tmp_path / "parity")
    assert parity.verdict == "same", parity.why


@pytest.mark.slow
def test_the_accelerate_copy_on_two_processes_ends_with_the_one_process_weights(tmp_path):
    """FLAT shuffles: rank 0 draws the original's order and dispatches it (AM810)."""
    copy, _, wrong = reach.migrate(FLAT, "accelerate=parity", tmp_path)
    assert not wrong and "accelerator.prepare(" in copy.read_text()
    parity = reach.parity_on_two(FLAT, copy, tmp_path / "parity", reach.MULTI_PROCESS["accelerate=parity"])
    assert parity.verdict == "same", parity.why


@pytest.mark.slow
def test_the_fabric_copy_of_a_shuffled_script_differs_as_its_note_says(tmp_path):
    """Fabric's DistributedSampler draws another order on 2 processes (AM910)."""
    copy, unfixed, wrong = reach.migrate(FLAT, "fabric=parity", tmp_path)
    assert not wrong and "fabric.setup(" in copy.read_text()
    parity = reach.parity_on_two(FLAT, copy, tmp_path / "parity", reach.MULTI_PROCESS["fabric=parity"])
    assert parity.verdict == "differ", parity.why
    found = reach.announced(parity, frozenset(f.code for f in unfixed))
    assert found.verdict == "expected" and found.why.endswith("as note AM910 says")
    assert reach.announced(parity, frozenset({"AM811"})).verdict == "differ"  # a note that may not apply


@pytest.mark.slow
def test_a_copy_that_trains_otherwise_differs(tmp_path):
    copy, _, _ = reach.migrate(FLAT, "ddp", tmp_path)
    source = copy.read_text()
    assert "lr=0.05" in source
    copy.write_text(source.replace("lr=0.05", "lr=0.2"))
    parity = reach.parity_on_two(FLAT, copy, tmp_path / "parity")
    assert parity.verdict == "differ", parity.why
    assert "from the one-process weights" in parity.why


def test_a_failed_launch_is_told_by_the_rank_error_not_the_launcher_summary():
    stderr = "[rank1]: Traceback\n[rank1]: ValueError: a batch of 25\nE1203 failed\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n=====\n"
    assert reach._last_error(stderr) == "[rank1]: ValueError: a batch of 25"
