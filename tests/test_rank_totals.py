"""ddp, accelerate and fabric combine the running totals a training loop
reads after it (AM514, AM833, AM933): sums and counts added up across the
processes, per-batch means averaged; what cannot be read as either, or a
total that is not the loop's own, stays as it is. On 2 gloo processes the
printed epoch figures are the one-process ones."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from accelmigrate.engine.migrate import migrate_source
from accelmigrate.runtime import distributed

from conftest import FIXTURES, PARITY, exact_options
from launching import Launch, cpu_env, on_two

EPOCH = textwrap.dedent(
    """\
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            {reset}
            for x, y in loader:
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                {add}
            print(total)


    if __name__ == "__main__":
        main()
    """
)


def migrated(reset: str, add: str, words=(("ddp", {}),)) -> str:
    return migrate_source(EPOCH.format(reset=reset, add=add), list(words), "train.py").code


@pytest.mark.parametrize(
    "add, combined",
    [
        ("total += loss.item()", "total = average_across_ranks(total)"),
        ("total += float(loss.data)", "total = average_across_ranks(total)"),
        ("total += loss.item() * x.size(0)", "total = sum_across_ranks(total)"),
        ("total += len(y)", "total = sum_across_ranks(total)"),
        ("total += (model(x).round() == y).sum().item()", "total = sum_across_ranks(total)"),
        ("total += torch.sum(model(x) > 0)", "total = sum_across_ranks(total)"),
    ],
)
def test_a_total_read_after_the_loop_is_combined_by_what_it_adds(add, combined):
    assert f"            {add}\n        {combined}\n" in migrated("total = 0.0", add)


@pytest.mark.parametrize(
    "reset, add",
    [
        ("total = 1.0", "total += loss.item()"),  # not a total from zero
        ("total = 0.0", "total += model.weight.norm().item()"),  # nothing of the batch's
        ("total = 0.0", "total += loss.item() / 2 if epoch else x.size(0)"),  # unclear
        ("pass", "total += loss.item()"),  # set elsewhere: the loop's additions are not all it holds
    ],
)
def test_what_is_not_the_loops_total_stays(reset, add):
    code = EPOCH.format(reset=reset, add=add)
    if reset == "pass":
        code = code.replace("    for epoch in range(2):", "    total = 0.0\n    for epoch in range(2):")
    result = migrate_source(code, [("ddp", {})], "train.py")
    assert "across_ranks" not in result.code and "AM514" not in {f.code for f in result.findings}


def test_a_total_set_above_the_with_block_around_the_loop_is_combined_inside_it():
    code = EPOCH.format(reset="total = 0.0", add="total += loss.item()").replace(
        "        for x, y in loader:\n", "        with torch.enable_grad():\n          for x, y in loader:\n"
    )
    result = migrate_source(code, [("ddp", {})], "train.py")
    assert "          total = average_across_ranks(total)\n" in result.code


def test_per_process_batches_keep_their_totals():
    assert "across_ranks" not in migrated("total = 0.0", "total += loss.item()", [("ddp", {"value": "per-process"})])


def test_a_world_of_one_keeps_each_values_type():
    assert distributed.sum_across_ranks(3) == 3 and isinstance(distributed.sum_across_ranks(3), int)
    total, count = distributed.sum_across_ranks(2.5, torch.tensor([4], dtype=torch.int64))
    assert total == 2.5 and count.dtype == torch.int64 and count.tolist() == [4]
    assert distributed.average_across_ranks(1.5) == 1.5


def test_accelerate_and_fabric_keep_each_totals_type():
    source = (FIXTURES / "ddp" / "running_totals_after_loop.py").read_text()
    accelerate = migrate_source(source, [("accelerate", PARITY)], "train.py")
    assert "AM833" in {f.code for f in accelerate.findings}
    assert 'hits = accelerator.reduce(torch.tensor(hits, dtype=torch.int64, device=accelerator.device), reduction="sum").item()' in accelerate.code
    fabric = migrate_source(source, [("fabric", PARITY)], "train.py").code
    assert 'batch_means = fabric.all_reduce(torch.tensor(batch_means, dtype=torch.float64), reduce_op="mean").item()' in fabric


@pytest.mark.slow
@pytest.mark.parametrize("word", ["ddp", "accelerate", "fabric"])
def test_two_processes_print_the_one_process_epoch_figures(tmp_path, word):
    source = (FIXTURES / "ddp" / "running_totals_after_loop.py").read_text()
    if word == "fabric":  # Fabric's sampler shuffles in another order than the one-process loader (AM910)
        source = source.replace("shuffle=True", "shuffle=False")
    (tmp_path / "original.py").write_text(source)
    (tmp_path / "migrated.py").write_text(migrate_source(source, [(word, exact_options(word))], "train.py").code)
    original = subprocess.run([sys.executable, "original.py"], capture_output=True, text=True, cwd=tmp_path, env=cpu_env(), timeout=600)
    assert original.returncode == 0, original.stderr[-3000:]
    Launch(tmp_path, "two", on_two(tmp_path / "migrated.py"), cpu_env(), tmp_path).wait().succeeded()

    def figures(text: str) -> list[list[float]]:
        lines = [line for line in text.splitlines() if line.startswith(("epoch", "mean of"))]
        return [[float(word) for word in line.split() if word[0].isdigit()] for line in lines]

    two, one = figures((tmp_path / "two.out").read_text()), figures(original.stdout)
    assert len(one) == 6 and len(two) == len(one)
    for got, expected in zip(two, one):
        assert got == pytest.approx(expected, abs=2e-6)
