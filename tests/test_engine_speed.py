"""The engine's shortcuts give exactly what the long way gives.

- `add_imports` (LibCST's AddImportsVisitor over the head of the module only)
  prints the same module as the visitor over the whole module, for every
  shape of module head and every kind of import asked for;
- on a stride through the fixtures of each folder (its first one always), with
  their own words (apply and check mode) and with every codemod (check mode),
  the migrated code and the findings are those of a
  run that adds imports over the whole module and, in check mode, builds
  every codemod's version of the file;
- past DIFFLIB_COMPARISONS, the line map of a long repetitive file is still
  difflib's.
"""

import dataclasses
import gc
import re
import sys
import weakref

import libcst as cst
import pytest
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from accelmigrate.codemods import _base as codemods_base
from accelmigrate.codemods import Codemod, UnknownCodemod, all_codemods, resolve
from accelmigrate.engine import line_map
from accelmigrate.engine import migrate as engine
from accelmigrate.engine.migrate import MigrationError, add_imports, migrate_source

from conftest import FIXTURES
from test_fixture_pairs import fixture_cases, plan_for

HEADS = {
    "empty": "",
    "only a docstring": '"""Train a model."""\n',
    "docstring then code": '"""Train a model."""\nx = 1\n',
    "strict flag": "__strict__ = True\nimport os\nx = 1\n",
    "future import": '"""Doc."""\nfrom __future__ import annotations\nimport os\n\nx = 1\n',
    "imports then code": "import os\nimport torch\nfrom torch import nn\n\n\ndef main():\n    pass\n",
    "comment above the first statement": "import torch\n# the model\nmodel = torch.nn.Linear(2, 2)\n",
    "no empty line after the imports": "import torch\nmodel = torch.nn.Linear(2, 2)\n",
    "only imports": "import torch\nfrom torch import nn\n",
    "import in a try block": "import os\ntry:\n    import apex\nexcept ImportError:\n    apex = None\nx = 1\n",
    "try block first": "try:\n    import apex\nexcept ImportError:\n    apex = None\nimport torch\n",
    "two imports on one line": "import os; import sys\nimport torch\nx = 1\n",
    "code before the imports": "x = 1\nimport torch\nfrom torch import nn\n",
    "the same from-import again later": "from torch import nn\nx = 1\nfrom torch import nn\n",
    "star import": "from torch import *\nx = 1\n",
    "main guard": "import torch\n\nif __name__ == '__main__':\n    from torch import nn\n    main()\n",
}

REQUESTS = {
    "module": [("torch", None, None)],
    "module already there": [("os", None, None)],
    "module with alias": [("numpy", None, "np")],
    "name from a module imported from": [("torch", "nn", None), ("torch", "optim", None)],
    "name from a new module": [("accelmigrate.runtime", "device", None)],
    "name with alias": [("torch.cuda", "amp", "cuda_amp")],
    "future": [("__future__", "annotations", None)],
    "several": [("os", None, None), ("sys", None, None), ("torch", "nn", None), ("torch.nn", "functional", "F")],
}


def _with_imports(source: str, requests, add) -> str:
    context = CodemodContext()
    for module, obj, alias in requests:
        AddImportsVisitor.add_needed_import(context, module, obj, alias)
    return add(context, cst.parse_module(source)).code


@pytest.mark.parametrize("requests", REQUESTS.values(), ids=REQUESTS.keys())
@pytest.mark.parametrize("source", HEADS.values(), ids=HEADS.keys())
def test_add_imports_prints_what_the_visitor_over_the_whole_module_prints(source, requests):
    whole = _with_imports(source, requests, lambda context, tree: AddImportsVisitor(context).transform_module(tree))
    assert _with_imports(source, requests, add_imports) == whole


def _every_codemod():
    plan = []
    for word in all_codemods():
        options = {}
        try:
            resolve({word: options})
        except UnknownCodemod:  # a word that needs a value
            options = {"value": "4"}
        plan.append((word, options))
    return plan


def _outcomes(case, check_only, plan=None):
    source = case.read_text(encoding="utf-8")
    try:
        migration = migrate_source(source, plan or plan_for(case, source), str(case), check_only=check_only)
    except MigrationError as error:
        return str(error)
    return migration.code, [_in_name_order(f) for f in migration.findings]


def _in_name_order(finding):
    """The finding with any list of names (`a`, `b`) in its message sorted:
    ddp lists the models an optimizer trains in the order of a set, which
    may change with whatever else the process allocated."""
    message = re.sub(r"`[^`]+`(?:, `[^`]+`)+", lambda names: ", ".join(sorted(names.group().split(", "))), finding.message)
    return dataclasses.replace(finding, message=message)


def _the_long_way(monkeypatch):
    """Imports added over the whole module; every codemod's walk over the
    module, whether it fixed anything or not; in check mode every codemod's
    version of the file built, whether a later codemod runs on it or not."""
    monkeypatch.setattr(engine, "add_imports", lambda context, tree: AddImportsVisitor(context).transform_module(tree))
    monkeypatch.setattr(Codemod, "on_visit", cst.CSTTransformer.on_visit)
    monkeypatch.setattr(engine, "_required_words", lambda selected: {cls.word for cls, _ in selected})


# Every fixture, twice, is minutes of CPU for one property of the engine's
# shortcuts (test_fixture_pairs already checks each fixture's output): a
# stride through each folder's sorted fixtures (its first one always) reaches
# every word, the projects and the scripts; every codemod on each, a longer one.
OWN_WORDS_STRIDE = 3
EVERY_CODEMOD_STRIDE = 10


def _strided(paths, stride: int = EVERY_CODEMOD_STRIDE) -> list:
    by_folder: dict = {}
    for path in sorted(paths):
        by_folder.setdefault(path.parent, []).append(path)
    return [path for folder in by_folder.values() for path in folder[::stride]]


def _strided_cases(stride: int) -> list:
    return [pytest.param(p, id=f"{p.parent.name}/{p.stem}") for p in _strided((c.values[0] for c in fixture_cases()), stride)]


@pytest.mark.parametrize("check_only", [False, True], ids=["apply", "check"])
@pytest.mark.parametrize("case", _strided_cases(OWN_WORDS_STRIDE))
def test_fixtures_give_what_the_long_way_gives(case, check_only, monkeypatch):
    fast = _outcomes(case, check_only)
    _the_long_way(monkeypatch)
    assert _outcomes(case, check_only) == fast


@pytest.mark.parametrize("case", _strided_cases(EVERY_CODEMOD_STRIDE))
def test_every_codemod_checks_what_the_long_way_checks(case, monkeypatch):
    """Check mode skips the versions of the file no later codemod reads."""
    fast = _outcomes(case, True, _every_codemod())
    _the_long_way(monkeypatch)
    assert _outcomes(case, True, _every_codemod()) == fast


def _copies(case: str, count: int) -> tuple[list[str], list[str]]:
    """A fixture's original and migrated lines, each repeated `count` times."""
    before = (FIXTURES / case).read_text(encoding="utf-8")
    after = (FIXTURES / case.replace(".py", ".expected.py")).read_text(encoding="utf-8")
    return line_map.lines_of(before) * count, line_map.lines_of(after) * count


@pytest.mark.parametrize("case", ["main-guard/env_before_import.py", "workers/basic.py", "device/alias_import_styles.py"])
def test_the_line_map_of_a_long_repetitive_file_is_difflib_s(case, monkeypatch):
    """Past DIFFLIB_COMPARISONS the lines are matched through anchors; on
    many copies of a migrated fixture that gives difflib's own map."""
    before, after = _copies(case, 40)
    monkeypatch.setattr(line_map, "DIFFLIB_COMPARISONS", 10**12)
    exact = line_map.line_map(before, after)
    monkeypatch.setattr(line_map, "DIFFLIB_COMPARISONS", 0)
    assert line_map.line_map(before, after) == exact


def test_lines_that_occur_unequally_often_are_aligned_between_anchors(monkeypatch):
    before = ["import torch", "", "x = 1", "", "y = 2", "z = 3", ""]
    after = ["import torch", "import os", "", "", "x = 1", "", "y = 2", "", "z = 3"]
    monkeypatch.setattr(line_map, "DIFFLIB_COMPARISONS", 10**12)
    exact = line_map._line_opcodes(before, after)
    monkeypatch.setattr(line_map, "DIFFLIB_COMPARISONS", 0)
    assert line_map._line_opcodes(before, after) == exact


@pytest.mark.slow
def test_codemods_that_plan_in_visit_module_record_nothing_during_their_walk(monkeypatch):
    """The walk of a codemod with `plans_in_visit_module` is skipped where it
    fixed nothing; that is right only if the walk never reports. Every
    fixture of a stride through them (every word's folder, the projects and
    the scripts), every codemod, each on the one before's output."""
    walking: dict[int, bool] = {}
    reported_while_walking: set[str] = set()
    on_leave, report = Codemod.on_leave, Codemod.report

    def visit(self, node):  # always walks
        descend = cst.CSTTransformer.on_visit(self, node)
        if isinstance(node, cst.Module):
            walking[id(self)] = descend
        return descend

    def leave(self, original, updated):
        if isinstance(original, cst.Module):
            walking[id(self)] = False
        return on_leave(self, original, updated)

    def record(self, node, code, message, fixed=False):
        if walking.get(id(self)):
            reported_while_walking.add(self.word)
        return report(self, node, code, message, fixed)

    monkeypatch.setattr(Codemod, "on_visit", visit)
    monkeypatch.setattr(Codemod, "on_leave", leave)
    monkeypatch.setattr(Codemod, "report", record)
    inputs = _strided(p for p in FIXTURES.rglob("*.py") if not p.name.endswith(".expected.py"))
    for path in inputs:
        try:
            migrate_source(path.read_text(encoding="utf-8"), _every_codemod(), str(path))
        except MigrationError:
            pass
    planners = {word for word, cls in all_codemods().items() if cls.plans_in_visit_module}
    assert planners and not planners & reported_while_walking
    assert reported_while_walking  # the probe works: the codemods that report while walking are seen to



def test_migrating_puts_back_the_collector_s_thresholds_and_the_recursion_limit():
    source = "import torch\nx = torch.ones(2).cuda()\n"
    plan = [("device", {})]
    seen = []

    before = (gc.get_threshold(), sys.getrecursionlimit())
    original = engine._run_codemods

    def watched(*args):
        seen.append((gc.get_threshold(), sys.getrecursionlimit()))
        return original(*args)

    try:
        engine._run_codemods = watched
        assert migrate_source(source, plan).code != source
    finally:
        engine._run_codemods = original
    (thresholds, limit), = seen
    assert thresholds[0] >= engine.GC_THRESHOLDS[0] and limit >= engine.DEEP_RECURSION_LIMIT
    assert (gc.get_threshold(), sys.getrecursionlimit()) == before
    gc.set_threshold(0)  # collection turned off by the caller stays off
    try:
        migrate_source(source, plan)
        assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before[0])


def test_a_file_s_script_model_goes_with_the_next_file_not_with_the_collector():
    """The facts codemods derive from a model point back at it; they are
    dropped when the next file's model is built, so the model (and its tree)
    is freed then, not at a full collection that a large heap makes rare."""
    plan = _every_codemod()
    source = (FIXTURES / "amp" / "class_trainer.py").read_text(encoding="utf-8")
    gc.collect()
    gc.disable()
    try:
        migrate_source(source, plan)
        first = weakref.ref(codemods_base._latest_script[1])
        migrate_source(source.replace("import torch\n", "import torch\n\n", 1), plan)
        assert codemods_base._latest_script[1] is not first()
        assert first() is None
    finally:
        gc.enable()
