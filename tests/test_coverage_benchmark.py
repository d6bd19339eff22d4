"""benchmarks/coverage.py counts each codemod's own findings, fixes apart from
refusals and notes, as `--to WORD` alone would give them."""

import importlib.util
import sys
from pathlib import Path

from conftest import FIXTURES

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "coverage.py"
_spec = importlib.util.spec_from_file_location("coverage_benchmark", _PATH)
coverage = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(coverage)


IN_MEMORY = [FIXTURES / "workers" / "in_memory_tensors.py", FIXTURES / "workers" / "in_memory_windows.py"]


def test_fixes_refusals_and_notes_are_counted_apart():
    tallies = coverage.tally(IN_MEMORY)
    workers = tallies["workers"]
    assert (workers.files, workers.migrated) == (2, 2)
    assert dict(workers.left) == {"AM108": 1}
    assert dict(workers.notes) == {"AM107": 4}
    assert tallies["item"].files == 0  # no backward: nothing for it


def test_a_word_that_needs_a_value_gets_one():
    assert coverage.options_for("workers") == {}
    assert coverage.options_for("accumulate") == {"value": coverage.VALUE_FOR_WORDS_THAT_NEED_ONE}


def test_the_table_has_a_row_per_codemod():
    tallies = coverage.tally(IN_MEMORY)
    text = coverage.table("Inputs", tallies, 2)
    assert "| `workers` | 2 | 2 | 1 | 67% | AM108 1 | AM107 4 |" in text
    assert text.count("\n| `") == len(tallies)
