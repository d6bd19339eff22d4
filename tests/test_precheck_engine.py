"""The engine's use of the `ast` pre-check: one CPython parse per file gives
both the syntax verdict and the facts; a file that no selected codemod can
apply to never reaches LibCST; the codemods that run are exactly those the
pre-check keeps, in running order. (That the pre-check never rejects a file a
codemod would change or report on is proved in tests/test_script_model.py;
that results stay the same, by tests/test_fixture_pairs.py.)"""

import ast
import textwrap

import pytest

from accelmigrate.codemods import all_codemods
from accelmigrate.codemods.script import RULES, precheck, words_that_may_apply
from accelmigrate.engine import migrate as engine
from accelmigrate.engine.migrate import MigrationError, migrate_source

VALUES = {"accumulate": {"value": "4"}, "batch-scale": {"value": "2"}}
# Every codemod that has a pre-check rule (one without is always kept).
WORDS = [word for word in all_codemods() if word in RULES]
EVERY_CODEMOD = [(word, VALUES.get(word, {})) for word in WORDS]

# Most codemods' text triggers are here (backward, step, DataLoader, cuda,
# load, optim, empty_cache, DataParallel, local_rank), but only in a
# docstring, comments and a string: a library module that trains nothing.
LIBRARY_MODULE = textwrap.dedent(
    '''\
    """Layers. Callers run backward() and optimizer.step() themselves; a
    DataLoader, DataParallel or torch.cuda.empty_cache() is theirs too."""
    import torch

    # load, local_rank and optim are mentioned only here
    UNITS = "units on cuda are the caller's"


    class Scale(torch.nn.Module):
        def forward(self, x):
            return x * 2
    '''
)

TRAINING_SCRIPT = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    """
)


@pytest.fixture
def libcst_parses(monkeypatch) -> list[str]:
    """The paths that LibCST parsed during the test."""
    parsed: list[str] = []
    real = engine._parse

    def parse(source, path):
        parsed.append(path)
        return real(source, path)

    monkeypatch.setattr(engine, "_parse", parse)
    return parsed


@pytest.fixture
def cpython_parses(monkeypatch) -> list[int]:
    """One entry per `ast.parse` call, wherever it is made."""
    calls: list[int] = []
    real = ast.parse

    def parse(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ast, "parse", parse)
    return calls


@pytest.mark.parametrize("check_only", [True, False], ids=["check", "apply"])
def test_a_file_no_codemod_can_apply_to_never_reaches_libcst(libcst_parses, cpython_parses, check_only: bool):
    assert sum(all_codemods()[word].wants(LIBRARY_MODULE) for word in WORDS) >= 8  # the text triggers pass
    assert words_that_may_apply(precheck(LIBRARY_MODULE), WORDS) == []
    cpython_parses.clear()
    migration = migrate_source(LIBRARY_MODULE, EVERY_CODEMOD, "layers.py", check_only=check_only)
    assert (migration.code, migration.findings) == (LIBRARY_MODULE, [])
    assert libcst_parses == []
    assert len(cpython_parses) == 1  # the syntax verdict and the facts come from one parse


def test_a_file_no_text_trigger_matches_is_parsed_once_by_cpython_only(libcst_parses, cpython_parses):
    source = "import torch\n\nx = torch.ones(2)\n"
    migration = migrate_source(source, [("empty-cache", {})], "clean.py")
    assert (migration.code, migration.findings) == (source, [])
    assert libcst_parses == [] and len(cpython_parses) == 1


@pytest.mark.parametrize(
    "plan", [[("workers", {})], EVERY_CODEMOD], ids=["no codemod wants it", "some codemod wants it"]
)
def test_a_syntax_error_keeps_cpython_s_position_either_way(plan, libcst_parses):
    source = "import torch\nfor x in loader:\n    loss.backward(\n    optimizer.step()\nx = 1 +\n"
    with pytest.raises(SyntaxError) as cpython:
        compile(source, "broken.py", "exec")
    with pytest.raises(MigrationError) as raised:
        migrate_source(source, plan, "broken.py")
    error = cpython.value
    assert str(raised.value) == f"broken.py:{error.lineno}:{error.offset}: syntax error: {error.msg}"
    assert libcst_parses == []


def test_only_the_codemods_the_precheck_keeps_run_in_running_order(monkeypatch):
    ran: list[str] = []
    real = engine._run_one

    def run_one(cls, *args, **kwargs):
        ran.append(cls.word)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(engine, "_run_one", run_one)
    wanted = [word for word in WORDS if all_codemods()[word].wants(TRAINING_SCRIPT)]
    kept = words_that_may_apply(precheck(TRAINING_SCRIPT), wanted)
    assert "empty-cache" not in kept and "workers" in kept  # the script has a loader and no empty_cache
    migrate_source(TRAINING_SCRIPT, EVERY_CODEMOD, "train.py")
    assert ran == kept


def test_a_word_may_apply_through_what_an_earlier_word_writes(monkeypatch):
    """`workers` writes `torch.cuda.is_available()`, where `device` may then
    find CUDA: with both selected, device runs on workers' output."""
    source = "import torch\nloader = torch.utils.data.DataLoader([1, 2], batch_size=1)\n"
    ran: list[str] = []
    real = engine._run_one
    monkeypatch.setattr(engine, "_run_one", lambda cls, *args, **kwargs: (ran.append(cls.word), real(cls, *args, **kwargs))[1])
    assert all_codemods()["device"].wants(source)  # its text trigger "load" is in `loader`
    migrate_source(source, [("device", {})], "data.py")
    assert "device" not in ran
    migrate_source(source, [("workers", {}), ("device", {})], "data.py")
    assert ran[-2:] == ["workers", "device"]
