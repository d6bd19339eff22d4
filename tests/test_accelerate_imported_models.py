"""`--to accelerate` and `--to fabric` of the stops the corpus showed most
often (fixtures/accelerate/imported_model_class.py,
fixtures/fabric/imported_model_class.py, and the refusals beside them).

- fast: a model made by a class this file cannot see (imported from the
  project's own module) is the trained model when an optimizer is made from
  its parameters and its forward makes the loss; a class of the file that
  derives from nothing is not. A loop over a progress bar or iterator bound
  to `tqdm(loader)` / `iter(loader)` reads that loader; one bound before the
  loader can be prepared is refused. A file opened for writing into a name
  is refused (only the main process would bind it);
- end to end (slow): each migrated fixture, beside a module holding the
  imported class, run with plain `python` and on 2 CPU processes under
  torchrun ends with the one-process original's weights (watched by
  fixtures/scripts/ddp_rank_weights.py) and prints each epoch line once.
"""

from __future__ import annotations

import sys

import pytest
from conftest import FIXTURES, exact_options
from launching import (
    ONE_PROCESS_TOLERANCE,
    RANK_WEIGHTS,
    assert_ranks_agree,
    cpu_env,
    largest_parameter_difference,
    launch_all,
    on_two,
    rank_weights,
)

from accelmigrate.engine.migrate import migrate_source
from accelmigrate.output.lint import is_note

# The modules the fixtures import their model classes from, as the project beside them would hold them.
PLANE_NETS = '''import torch.nn as nn


class PlaneNet(nn.Module):
    def __init__(self, inputs, hidden):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.body(x)
'''
RING_MODELS = '''import torch.nn as nn


class RingRegressor(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(2, width), nn.ReLU(), nn.Linear(width, 1))

    def forward(self, points):
        return self.layers(points)
'''
CASES = {
    "accelerate": (FIXTURES / "accelerate" / "imported_model_class.py", "plane_nets.py", PLANE_NETS),
    "fabric": (FIXTURES / "fabric" / "imported_model_class.py", "ring_models.py", RING_MODELS),
}


def _migrate(source: str, word: str):
    return migrate_source(source, [(word, exact_options(word))], "train.py")


def _refusals(result) -> list[str]:
    return [f.code for f in result.findings if not f.fixed and not is_note(f)]


@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_a_model_of_an_imported_class_trained_by_an_optimizer_is_prepared(word):
    result = _migrate(CASES[word][0].read_text(), word)
    assert _refusals(result) == []
    if word == "accelerate":
        assert "net, optimizer, loader = accelerator.prepare(net, optimizer, loader)" in result.code
    else:
        assert "model, optimizer = fabric.setup(model, optimizer)" in result.code
        assert "loader = fabric.setup_dataloaders(loader)" in result.code


def test_parameters_filtered_into_a_name_before_the_optimizer_still_show_the_model():
    source = CASES["accelerate"][0].read_text().replace(
        "    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)",
        "    params = filter(lambda p: p.requires_grad, net.parameters())\n    optimizer = torch.optim.Adam(params, lr=0.01)",
    )
    assert "params = filter(" in source
    result = _migrate(source, "accelerate")
    assert _refusals(result) == [] and "accelerator.prepare(net, optimizer, loader)" in result.code


@pytest.mark.parametrize("word, code", [("accelerate", "AM820"), ("fabric", "AM920")])
def test_a_class_of_the_file_that_is_no_module_is_not_taken_for_a_model(word, code):
    source = (FIXTURES / "accelerate" / "refused_plain_object_parameters.py").read_text()
    result = _migrate(source, word)
    assert _refusals(result) == [code] and result.code == source
    assert "no model found" in result.findings[0].message


def test_a_base_class_this_file_cannot_see_leaves_the_model_trained():
    source = (FIXTURES / "accelerate" / "refused_plain_object_parameters.py").read_text()
    derived = source.replace("import torch\n", "import torch\nfrom project_bases import Trainable\n", 1).replace("class Line:", "class Line(Trainable):")
    assert "accelerator.prepare(line, optimizer, loader)" in _migrate(derived, "accelerate").code


@pytest.mark.parametrize("word, code", [("accelerate", "AM820"), ("fabric", "AM920")])
def test_a_progress_bar_made_before_the_loader_is_prepared_is_refused(word, code):
    source = (FIXTURES / "accelerate" / "refused_bar_before_prepare.py").read_text()
    result = _migrate(source, word)
    assert _refusals(result) == [code] and result.code == source
    # Made where the loop starts, it wraps the prepared loader.
    moved = source.replace("    bar = tqdm(loader, disable=True)\n", "").replace("    for xb, yb in bar:", "    bar = tqdm(loader, disable=True)\n    for xb, yb in bar:")
    assert _refusals(_migrate(moved, word)) == []


def test_a_name_bound_to_anything_else_as_well_is_no_loader():
    source = CASES["accelerate"][0].read_text()
    rebound = source.replace("        for inputs, wanted in bar:", "        bar = bar if epoch else list(loader)\n        for inputs, wanted in bar:")
    assert "AM820" in _refusals(_migrate(rebound, "accelerate"))


@pytest.mark.parametrize("word, code", [("accelerate", "AM826"), ("fabric", "AM926")])
def test_a_file_opened_for_writing_into_a_name_is_refused(word, code):
    source = (FIXTURES / word / "refused_log_file_bound.py").read_text()
    result = _migrate(source, word)
    assert _refusals(result) == [code] and result.code == source
    # Written within a `with` block, it is the main process's alone.
    blocked = source.replace('    log = open("losses.csv", "w")\n', "").replace(
        '        log.write(f"{epoch},{loss.item()}\\n")\n    log.close()\n',
        '        with open("losses.csv", "a") as log:\n            log.write(f"{epoch},{loss.item()}\\n")\n',
    )
    assert blocked != source and _refusals(_migrate(blocked, word)) == []


# -- end to end ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("imported_models")
    plans = {}
    for word, (fixture, module, text) in CASES.items():
        folder = work / word
        folder.mkdir()
        (folder / module).write_text(text)
        original = folder / "original.py"
        original.write_text(fixture.read_text())
        migrated = folder / "migrated.py"
        migrated.write_text(_migrate(fixture.read_text(), word).code)
        plans[f"{word}_original"] = [sys.executable, str(RANK_WEIGHTS), "{folder}", str(original)]
        plans[f"{word}_plain"] = [sys.executable, str(RANK_WEIGHTS), "{folder}", str(migrated)]
        plans[f"{word}_two"] = on_two(RANK_WEIGHTS, "{folder}", str(migrated))
    launches, folders = launch_all(work, plans, cpu_env(ACCELERATE_USE_CPU="true"))
    for launch in launches.values():
        launch.succeeded()
    return launches, folders


@pytest.mark.slow
@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_migrated_imported_model_ends_with_the_originals_weights(runs, word):
    launches, folders = runs
    (original,) = rank_weights(folders[f"{word}_original"])
    (plain,) = rank_weights(folders[f"{word}_plain"])
    two = assert_ranks_agree(launches[f"{word}_two"], folders[f"{word}_two"])
    assert largest_parameter_difference(original, plain) <= ONE_PROCESS_TOLERANCE
    assert largest_parameter_difference(original, two) <= ONE_PROCESS_TOLERANCE
    for run in ("plain", "two"):
        assert launches[f"{word}_{run}"].stdout.count("done") == 3
