"""A word never changes nothing without a word: over every fixture and every
bundled script that trains (a backward call), each word that acts on a
training step either changes the file, or says something about it (a
finding of its own, fixed or not, a note included), or the engine says
where the training is instead (AM005, AM006) or why the word does not run
there (AM001 in a notebook). A file whose marks silence the word's codes is
the user's choice, and left out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from accelmigrate.codemods import parse_words, resolve
from accelmigrate.codemods.script.precheck import facts_of
from accelmigrate.engine.migrate import NOT_IN_NOTEBOOK, TRAINER_LOOP, TRAINING_ELSEWHERE, plan_of, process_file
from conftest import FIXTURES

STEP_WORDS = ("amp", "ddp", "accelerate", "fabric", "accumulate=2", "fsdp")
SPEAKING_FOR_THE_WORD = {TRAINING_ELSEWHERE, TRAINER_LOOP, NOT_IN_NOTEBOOK}


def training_files() -> list[Path]:
    found = []
    for path in sorted(FIXTURES.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path.name.endswith(".expected.py") or "accelmigrate: skip" in text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        if facts_of(tree, text).backward_calls:
            found.append(path)
    return found


@pytest.mark.parametrize("words", STEP_WORDS)
def test_a_word_on_a_training_script_changes_it_or_says_why_not(words):
    plan = plan_of(resolve(parse_words([words])))
    word = words.partition("=")[0]
    silent = []
    files = training_files()
    assert len(files) > 300  # the fixtures and the bundled scripts
    for path in files:
        result = process_file(str(path), plan, check_only=True)
        if result.error is None and not any(f.word == word or f.code in SPEAKING_FOR_THE_WORD for f in result.findings):
            silent.append(str(path.relative_to(FIXTURES)))
    assert not silent, f"{words} changed nothing and said nothing on: {silent}"
