"""benchmarks/never_slower.py: the copies it times are the script migrated as
`apply` would (the default words, `checklist`), each in a copy of the
script's folder, and a script that does not run here is left out of the
table. The timings themselves are the benchmark's to print, not a test's."""

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "never_slower.py"
_spec = importlib.util.spec_from_file_location("never_slower_benchmark", _PATH)
never_slower = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(never_slower)

SCRIPTS = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"


def test_each_copy_is_the_script_as_apply_migrates_it(tmp_path):
    made = never_slower.copies(SCRIPTS / "workers_seeded_epochs.py", tmp_path)
    assert set(made) == {"original", "default", "checklist"}
    assert made["original"].read_text() == (SCRIPTS / "workers_seeded_epochs.py").read_text()
    assert "num_workers=default_num_workers()" in made["default"].read_text()  # its items cost a decoder's work
    assert "autocast" in made["checklist"].read_text()
    assert all(copy.parent.name == name for name, copy in made.items())  # a folder of its own each


@pytest.mark.slow
def test_a_script_that_fails_here_is_left_out_and_one_that_runs_is_timed(tmp_path):
    failing = tmp_path / "fails.py"
    failing.write_text("raise SystemExit(3)\n")
    assert never_slower.timed_run(failing) is None
    ran = tmp_path / "runs.py"
    ran.write_text("print('final loss: 0.5')\n")
    assert never_slower.timed_run(ran) > 0
