"""accumulate=N on a script that trains through Accelerate (codemods/_accumulate/accelerate_form.py).

- fast: `--to accelerate,accumulate=4` writes Accelerate's own form
  (`gradient_accumulation_steps=` on the Accelerator, the step under
  `accelerator.accumulate(model)`, clipping under `accelerator.sync_gradients`),
  never `loss.backward()`'s (no `(accelerator / group_size)`); a backward
  through something that is not an Accelerator is refused, not rewritten;
- end to end (slow): fixtures/accumulate/accelerate_plain_main.py (main(),
  argparse, a DataLoader, clipping, a mean loss) and accelerate_summed.py (a
  flat script, a summed loss), migrated with `--to accelerate,accumulate=4`
  and run with micro-batches of 8 under plain `python` and on 2 CPU processes
  under torchrun (ACCELERATE_USE_CPU=true), end with the weights of the
  original run with batches of 32, within 1e-5, when the loader's length is a
  multiple of 4; so does accelerate_plain_main.py migrated with
  `--to fabric,accumulate=4` (the plain form, Fabric's no_backward_sync).
  When it is not (112 samples: 14 micro-batches, the last group
  of 2), the mean loss's last group steps with 2/4 of its mean gradient, as
  AM609 says (a hand-written run that scales the big batch's last loss so
  matches); a summed loss stays exact at any length. Accelerate's own
  sync pattern, which the note rests on, is checked directly.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, PARITY
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

STEPS = 4
MICRO_BATCH, BIG_BATCH = 8, 32
CASES = FIXTURES / "accumulate"
# Clipping to a norm the gradients exceed would hide a step's scale (the short last group's).
LOOSE_NORM = 100.0
UNCLIPPED = ("--max-norm", str(LOOSE_NORM))
WORDS = [("accelerate", PARITY), ("accumulate", {"value": str(STEPS)})]
FABRIC_WORDS = [("fabric", PARITY), ("accumulate", {"value": str(STEPS)})]


def _migrated(name: str, words=WORDS):
    source = (CASES / name).read_text()
    return migrate_source(source, words, name)


# -- fast ------------------------------------------------------------------------------------


def test_an_accelerator_backward_is_never_divided_as_a_loss():
    result = _migrated("../accelerate/dataparallel_in_main.py")
    assert "/ group_size" not in result.code and "group_size" not in result.code
    assert "gradient_accumulation_steps=ACCUMULATION_STEPS" in result.code
    assert "with accelerator.accumulate(net):" in result.code
    assert "if accelerator.sync_gradients:\n                    accelerator.clip_grad_norm_(" in result.code
    assert "accelerator.backward(loss)" in result.code and "(accelerator" not in result.code


def test_a_zero_grad_before_the_forward_moves_after_the_step():
    """Under accumulate(), a prepared zero_grad() runs only at the group's last
    micro-batch: left before the forward it would clear the group's gradients."""
    code = _migrated("accelerate_plain_main.py").code
    step = code.index("optimizer.step()")
    assert code.index("optimizer.zero_grad()") > step > code.index("accelerator.backward(loss)")


def test_a_backward_through_another_object_is_refused_unchanged():
    name = "accelerate_refused_deepspeed_engine.py"
    source = (CASES / name).read_text()
    result = migrate_source(source, [("accumulate", {"value": str(STEPS)})], name)
    assert result.code == source
    assert [f.code for f in result.findings] == ["AM611"]


def test_fabric_divides_its_backwards_argument_and_skips_the_sync_with_its_own_context():
    source = (CASES / "fabric_own_script.py").read_text()
    code = migrate_source(source, [("accumulate", {"value": str(STEPS)})], "fabric_own_script.py").code
    assert "fabric.backward(loss / group_size)" in code and "(fabric / group_size)" not in code
    assert "with fabric.no_backward_sync(tagger, enabled=not end_of_group):" in code
    assert "if end_of_group:\n                fabric.clip_gradients(" in code


def test_a_summed_loss_is_multiplied_back_by_the_accumulation_steps():
    code = _migrated("accelerate_summed.py").code
    assert "accelerator.backward(loss * accelerator.num_processes * accelerator.gradient_accumulation_steps)" in code


# -- end to end ------------------------------------------------------------------------------

SYNC_PATTERN = """
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(TensorDataset(torch.randn(48, 2)), batch_size=8))
for epoch in range(2):
    for (x,) in loader:
        with accelerator.accumulate(model):
            print("sync" if accelerator.sync_gradients else "skip")
"""


def _by_hand_with_short_last_group(samples: int, max_norm: float) -> list[torch.Tensor]:
    """accelerate_plain_main.py's training with batches of 32, each epoch's last
    (shorter) batch's loss scaled by (its micro-batches)/4: what AM609 says
    Accelerate computes for it."""
    torch.manual_seed(0)
    features = torch.randn(samples, 6)
    targets = features @ torch.randn(6, 1) + 0.1 * torch.randn(samples, 1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        for start in range(0, samples, BIG_BATCH):
            x, y = features[start : start + BIG_BATCH], targets[start : start + BIG_BATCH]
            optimizer.zero_grad()
            scale = math.ceil(len(x) / MICRO_BATCH) / STEPS
            (torch.nn.functional.mse_loss(model(x), y) * scale).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
            optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("accumulate_accelerate")
    scripts = {}
    for name in ("accelerate_plain_main.py", "accelerate_summed.py"):
        result = _migrated(name)
        assert "accumulate(model)" in result.code, [str(f) for f in result.findings]
        scripts[name] = work / f"migrated_{name}"
        scripts[name].write_text(result.code)
    (work / "sync_pattern.py").write_text(SYNC_PATTERN)
    fabric = migrate_source((CASES / "accelerate_plain_main.py").read_text(), FABRIC_WORDS, "fabric_main.py")
    assert "fabric.no_backward_sync(model" in fabric.code, [str(f) for f in fabric.findings]
    new_fabric = work / "fabric_main.py"
    new_fabric.write_text(fabric.code)
    main, summed = CASES / "accelerate_plain_main.py", CASES / "accelerate_summed.py"
    new_main, new_summed = scripts["accelerate_plain_main.py"], scripts["accelerate_summed.py"]
    python = sys.executable

    def watched(script: Path, *args: str) -> list[str]:
        return [str(RANK_WEIGHTS), "{folder}", str(script), *args]

    def main_args(batch: int, samples: int, *more: str) -> list[str]:
        return ["--batch-size", str(batch), "--samples", str(samples), "--out", "{folder}/weights.pt", *more]

    plans = {
        "big": [python, *watched(main, *main_args(BIG_BATCH, 128))],
        "plain": [python, *watched(new_main, *main_args(MICRO_BATCH, 128))],
        "two": on_two(*watched(new_main, *main_args(MICRO_BATCH, 128))),
        "fabric_plain": [python, *watched(new_fabric, *main_args(MICRO_BATCH, 128))],
        "fabric_two": on_two(*watched(new_fabric, *main_args(MICRO_BATCH, 128))),
        "small": [python, *watched(main, *main_args(MICRO_BATCH, 128))],
        "big_uneven": [python, *watched(main, *main_args(BIG_BATCH, 112, *UNCLIPPED))],
        "plain_uneven": [python, *watched(new_main, *main_args(MICRO_BATCH, 112, *UNCLIPPED))],
        "sum_big": [python, *watched(summed, "100", str(BIG_BATCH), "{folder}/summed.pt")],
        "sum_plain": [python, *watched(new_summed, "100", str(MICRO_BATCH), "{folder}/summed.pt")],
        "sum_big_even": [python, *watched(summed, "128", str(BIG_BATCH), "{folder}/summed.pt")],
        "sum_two": on_two(*watched(new_summed, "128", str(MICRO_BATCH), "{folder}/summed.pt")),
        "sync_pattern": [python, str(work / "sync_pattern.py")],
    }
    return launch_all(work, plans, cpu_env(ACCELERATE_USE_CPU="true"))


def _one(runs, name: str) -> list[torch.Tensor]:
    launches, folders = runs
    launch = launches[name].succeeded()
    if name.endswith("two"):
        return assert_ranks_agree(launch, folders[name])
    (weights,) = rank_weights(folders[name])
    return weights


@pytest.mark.slow
def test_accelerate_ends_a_group_every_n_batches_and_at_the_loaders_end(runs):
    """6 batches an epoch, N=4: a group of 4, then one of 2 at the loader's end
    (GradientState.end_of_dataloader resets the count: no group spans epochs)."""
    launches, _ = runs
    lines = launches["sync_pattern"].succeeded().stdout.split()
    assert lines == ["skip", "skip", "skip", "sync", "skip", "sync"] * 2


@pytest.mark.slow
@pytest.mark.parametrize("reference, migrated", [("big", "plain"), ("big", "two"), ("sum_big", "sum_plain"), ("sum_big_even", "sum_two"), ("big", "fabric_plain"), ("big", "fabric_two")])
def test_micro_batches_end_with_the_big_batch_weights(runs, reference, migrated):
    assert largest_parameter_difference(_one(runs, reference), _one(runs, migrated)) <= ONE_PROCESS_TOLERANCE


@pytest.mark.slow
def test_the_comparison_tells_micro_batches_from_big_ones(runs):
    assert largest_parameter_difference(_one(runs, "big"), _one(runs, "small")) > 100 * ONE_PROCESS_TOLERANCE


@pytest.mark.slow
def test_a_short_last_group_steps_with_its_share_of_the_mean_as_the_note_says(runs):
    """112 samples: each epoch's last group holds 2 micro-batches of 8. Accelerate
    divides their mean losses by 4, so that step takes 2/4 of the 16 samples'
    mean gradient (AM609), not the big batch's mean."""
    migrated = _one(runs, "plain_uneven")
    assert largest_parameter_difference(_one(runs, "big_uneven"), migrated) > 100 * ONE_PROCESS_TOLERANCE
    assert largest_parameter_difference(_by_hand_with_short_last_group(112, LOOSE_NORM), migrated) <= ONE_PROCESS_TOLERANCE
