"""Realistic training scripts, run before and after migration with the default
codemods (workers, item, empty-cache). Those rewrites must not change the
arithmetic: the migrated script exits 0 and prints the same final loss."""

import re
import shutil
from pathlib import Path

import pytest

from accelmigrate.codemods import DEFAULT_WORDS
from accelmigrate.engine.migrate import migrate_source

from conftest import SCRIPTS, run_python

FINAL_LOSS = re.compile(r"final loss: (\S+)")
SCRIPTS_FOR_DEFAULTS = ["mlp_classifier.py", "char_lstm.py", "trainer_class.py", "workers_seeded_epochs.py"]


def final_loss(completed) -> float:
    assert completed.returncode == 0, completed.stderr[-3000:]
    match = FINAL_LOSS.search(completed.stdout)
    assert match, completed.stdout
    return float(match.group(1))


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS_FOR_DEFAULTS)
def test_default_migration_keeps_the_final_loss(name: str, tmp_path: Path):
    original = SCRIPTS / name
    source = original.read_text(encoding="utf-8")
    migration = migrate_source(source, [(word, {}) for word in DEFAULT_WORDS], str(original))
    fixed_words = {f.word for f in migration.findings if f.fixed}
    assert migration.code != source and fixed_words, "the example should exercise the default codemods"
    migrated = tmp_path / name
    migrated.write_text(migration.code, encoding="utf-8")

    before = final_loss(run_python(original))
    after = final_loss(run_python(migrated))
    assert after == pytest.approx(before, rel=1e-6, abs=1e-7)


def test_examples_exercise_every_default_codemod():
    fixed = set()
    for name in SCRIPTS_FOR_DEFAULTS:
        path = SCRIPTS / name
        migration = migrate_source(path.read_text(encoding="utf-8"), [(w, {}) for w in DEFAULT_WORDS], str(path))
        fixed |= {f.word for f in migration.findings if f.fixed}
    # modernize rewrites pre-0.4 code, which cannot run before it: its run test
    # is tests/test_modernize.py (a 2018 script against a hand-modernised copy).
    assert fixed == set(DEFAULT_WORDS) - {"modernize"}
