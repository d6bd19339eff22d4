"""Evaluation loaders sharded by `--to accelerate` (codemods/_accelerate/metrics.py).

- fast: which evaluation loops are sharded (the loader prepared, a
  `gather_for_metrics` after the forward) and which stay whole;
- end to end (slow): the eval_* fixtures (an eval pass in main() with a summed
  loss over `len(test_loader.dataset)` and argmax accuracy; a flat script's
  evaluate() with `enumerate` and `total += y.size(0)`; a flat script whose
  shuffled training loader makes the Accelerator dispatch batches) migrated,
  run under plain `python` and on 2 CPU processes under torchrun (gloo,
  ACCELERATE_USE_CPU=true), print the original's evaluation lines once:
  the counts exactly, every float within 1e-6. Each eval set has a size the
  batch does not divide, so the last batch is padded on 2 processes and the
  padding must be dropped for the counts to match.
"""

from __future__ import annotations

import re
import sys

import pytest
from conftest import PARITY, ROOT
from launching import cpu_env, launch_all, on_two

from accelmigrate.engine.migrate import migrate_source

FIXTURES = ROOT / "fixtures" / "accelerate"
SHARDED = ("eval_accuracy_in_main", "eval_flat_function", "eval_flat_dispatched")
TOLERANCE = 1e-6
FLOAT = re.compile(r"-?\d+\.\d+")


def _migrate(source: str):
    return migrate_source(source, [("accelerate", PARITY)], "train.py")


@pytest.mark.parametrize("case", SHARDED)
def test_sharded_loops_gather_after_the_forward(case):
    migrated = _migrate((FIXTURES / f"{case}.py").read_text()).code
    assert migrated.count(".gather_for_metrics(") == 1
    assert re.search(r"accelerator\.prepare\([^)]*test_loader\)", migrated)


def test_loops_that_cannot_be_read_whole_stay_whole():
    result = _migrate((FIXTURES / "eval_stays_whole.py").read_text())
    assert "gather_for_metrics" not in result.code
    assert "AM813" not in {f.code for f in result.findings}
    assert "accelerator.prepare(model, optimizer, train_loader)" in result.code


def test_a_loader_with_one_loop_that_stays_whole_is_not_sharded():
    source = (FIXTURES / "eval_flat_dispatched.py").read_text()
    # A second pass over the same loader, reading the batch through a name bound before the forward.
    source += "for x, y in test_loader:\n    x = x.to(dev) * 2\n    print(model(x).sum().item())\n"
    migrated = _migrate(source).code
    assert "accelerator.prepare(model, opt, train_loader)" in migrated and "gather_for_metrics" not in migrated


@pytest.mark.parametrize("change, why", [
    (("batch_size=12)", "batch_size=13)"), "a batch that two processes cannot split"),
    (("model.eval()\ncorrect", "correct"), "the model left in train mode: a shard's batch norm sees another batch"),
    (("    for step, (x, y) in enumerate(test_loader):", "    for step, (x, y) in enumerate(test_loader, 1):"), "enumerate with a start"),
    (("        logits = model(x)\n", "        x = x.flatten(1)\n        logits = model(x)\n"), "the batch changed before the forward"),
    (("        logits = model(x)\n", "        logits = model(x, y)\n"), "a forward given the targets may return a loss"),
    (("nn.Tanh(), ", "nn.Tanh(), nn.GRU(12, 12), "), "a layer that puts the sequence first"),
])
def test_flat_loop_variants_that_stay_whole(change, why):
    source = (FIXTURES / "eval_flat_dispatched.py").read_text()
    assert change[0] in source
    migrated = _migrate(source.replace(*change)).code
    assert "accelerator.prepare(model, opt, train_loader)" in migrated, why  # migrated, the loader whole


def test_a_suppressed_gather_leaves_the_loader_whole():
    source = (FIXTURES / "eval_flat_dispatched.py").read_text()
    source = source.replace("        logits = model(x)\n", "        logits = model(x)  # accelmigrate: skip[AM813]\n")
    migrated = _migrate(source).code
    assert "accelerator.prepare(model, opt, train_loader)" in migrated and "gather_for_metrics" not in migrated


def test_a_batch_read_after_the_loop_is_gathered_too():
    source = (FIXTURES / "eval_flat_dispatched.py").read_text() + "print(x.shape)\n"
    assert "logits, x, y = accelerator.gather_for_metrics((logits, x, y))" in _migrate(source).code


def test_an_evaluation_before_the_training_stays_whole():
    source = (FIXTURES / "eval_accuracy_in_main.py").read_text()
    baseline = "    for data, target in test_loader:\n        data, target = data.to(device), target.to(device)\n        print(model(data).sum().item())\n"
    source = source.replace("    for epoch in range(args.epochs):\n", "    model.eval()\n" + baseline + "    for epoch in range(args.epochs):\n")
    migrated = _migrate(source).code
    assert "accelerator.prepare(model, optimizer, train_loader)" in migrated and "gather_for_metrics" not in migrated


def _split(line: str) -> tuple[str, list[float]]:
    return FLOAT.sub("#", line), [float(f) for f in FLOAT.findall(line)]


def _assert_same_lines(original: str, migrated: str) -> None:
    expected, got = original.splitlines(), migrated.splitlines()
    assert len(got) == len(expected), f"printed {len(got)} lines, the original {len(expected)}:\n{migrated}"
    for want, have in zip(expected, got):
        (want_text, want_floats), (have_text, have_floats) = _split(want), _split(have)
        assert have_text == want_text, f"{have!r} != {want!r}"  # counts, batches, steps: exact
        assert all(abs(a - b) <= TOLERANCE for a, b in zip(want_floats, have_floats)), f"{have!r} != {want!r}"


@pytest.mark.slow
def test_migrated_scripts_print_the_originals_evaluation(tmp_path):
    plans = {}
    for case in SHARDED:
        original = tmp_path / f"{case}.py"
        original.write_text((FIXTURES / f"{case}.py").read_text())
        migrated = tmp_path / f"{case}_migrated.py"
        migrated.write_text(_migrate(original.read_text()).code)
        assert "gather_for_metrics" in migrated.read_text()
        plans[f"{case}-original"] = [sys.executable, str(original)]
        plans[f"{case}-python"] = [sys.executable, str(migrated)]
        plans[f"{case}-torchrun"] = on_two(migrated)
    work = tmp_path / "runs"
    work.mkdir()
    launches, _ = launch_all(work, plans, cpu_env(ACCELERATE_USE_CPU="true"))
    for launch in launches.values():
        launch.succeeded()
    for case in SHARDED:
        original = launches[f"{case}-original"].stdout
        assert original.strip(), f"{case}: the original printed nothing"
        for how in ("python", "torchrun"):
            _assert_same_lines(original, launches[f"{case}-{how}"].stdout)
