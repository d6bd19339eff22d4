"""Losses summed over the batch: how the script model reads a loss's
reduction (codemods/script/reduction.py), and what accumulate and ddp make of
it.

- the reading: a mean, a sum, unclear (the file decides it but cannot be
  read) or unknown (the file says nothing), for the shapes real scripts use;
- accumulate=2 on a sum-reduced loss leaves the loss undivided, and the
  migration with half the batch ends with the weights of the original with
  the whole batch (dividing, as before, trains at half the learning rate);
- ddp on a sum-reduced loss makes DDP add the ranks' gradients up: two gloo
  processes under `accelmigrate run` end with the one-process original's
  weights (the average, as before, does not).

The cases also live as fixture pairs: fixtures/accumulate/sum_*.py and
fixtures/ddp/sum_*.py.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest
import torch

from accelmigrate.codemods.script import ScriptModel
from accelmigrate.codemods.script.reduction import MEAN, SUM, UNCLEAR, backward_reduction
from accelmigrate.engine.migrate import migrate_source

from conftest import exact_options, run_cli, run_python

TOLERANCE = 1e-5  # as the accumulate and ddp parity tests: float sums in another order

HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
loader = DataLoader(ds, batch_size=args.batch_size)
model = nn.Linear(2, 2)
"""

READINGS = {
    "criterion binding, reduction='sum'": (SUM, """
        criterion = nn.CrossEntropyLoss(reduction='sum')
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
    """),
    "criterion default, moved to the device": (MEAN, """
        criterion = nn.CrossEntropyLoss().to(device)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
    """),
    "old API size_average=False": (SUM, """
        for x, y in loader:
            loss = F.nll_loss(model(x), y, size_average=False)
            loss.backward()
    """),
    "sum scaled by the data set's size": (SUM, """
        for x, y in loader:
            loss = F.mse_loss(model(x), y, reduction='sum') / len(loader.dataset)
            loss.backward()
    """),
    "sum divided by the batch's size": (MEAN, """
        for x, y in loader:
            loss = F.mse_loss(model(x), y, reduction='sum') / x.size(0)
            loss.backward()
    """),
    "sum divided by the loader's batch size": (MEAN, """
        for x, y in loader:
            loss = F.mse_loss(model(x), y, reduction='sum') / args.batch_size
            loss.backward()
    """),
    "sum divided by a value the file does not show": (UNCLEAR, """
        for x, y in loader:
            loss = F.mse_loss(model(x), y, reduction='sum') / args.scale
            loss.backward()
    """),
    ".sum() of squared errors": (SUM, """
        for x, y in loader:
            loss = ((model(x) - y) ** 2).sum()
            loss.backward()
    """),
    ".mean() of squared errors": (MEAN, """
        for x, y in loader:
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
    """),
    "a loss the file does not show": (None, """
        for x, y in loader:
            loss = model(x, y)
            loss.backward()
    """),
    "an attribute of an output": (None, """
        for x, y in loader:
            loss = outputs.loss
            loss.backward()
    """),
    "reduction chosen at run time": (UNCLEAR, """
        for x, y in loader:
            loss = nn.MSELoss(reduction=args.r)(model(x), y)
            loss.backward()
    """),
    "the VAE example's loss function": (SUM, """
        def loss_function(recon_x, x, mu, logvar):
            BCE = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction='sum')
            KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
            return BCE + KLD
        for x, y in loader:
            recon, mu, logvar = model(x)
            loss = loss_function(recon, x, mu, logvar)
            loss.backward()
    """),
    "a loss class of the file": (MEAN, """
        class Focal(nn.Module):
            def forward(self, a, b):
                ce = F.cross_entropy(a, b, reduction='none')
                return (0.25 * (1 - torch.exp(-ce)) ** 2 * ce).mean()
        crit = Focal()
        for x, y in loader:
            loss = crit(model(x), y)
            loss.backward()
    """),
    "a loss class of the file that reduces as it is told": (UNCLEAR, """
        class Focal(nn.Module):
            def forward(self, a, b):
                ce = F.cross_entropy(a, b, reduction='none')
                if self.reduction == 'sum':
                    return ce.sum()
                return ce.mean()
        crit = Focal()
        for x, y in loader:
            loss = crit(model(x), y)
            loss.backward()
    """),
    "sums added up over heads": (SUM, """
        for x, y in loader:
            loss = 0
            for h in heads:
                loss += F.cross_entropy(h, y, reduction='sum')
            loss.backward()
    """),
    "a mean added to a sum": (UNCLEAR, """
        for x, y in loader:
            loss = F.cross_entropy(model(x), y) + F.mse_loss(model(x), y, reduction='sum')
            loss.backward()
    """),
    "a mean beside a regulariser": (MEAN, """
        for x, y in loader:
            loss = F.cross_entropy(model(x), y) + 1e-4 * reg(model)
            loss.backward()
    """),
    "through a gradient scaler": (SUM, """
        scaler = torch.cuda.amp.GradScaler()
        criterion = nn.MSELoss(reduction='sum')
        for x, y in loader:
            loss = criterion(model(x), y)
            scaler.scale(loss).backward()
    """),
    "a criterion stored on self": (SUM, """
        class T:
            def __init__(self):
                self.criterion = nn.L1Loss(reduction='sum')
            def fit(self):
                for x, y in loader:
                    loss = self.criterion(model(x), y)
                    loss.backward()
    """),
    "a criterion passed to the training function": (SUM, """
        def train(crit):
            for x, y in loader:
                loss = crit(model(x), y)
                loss.backward()
        train(nn.CrossEntropyLoss(reduction='sum'))
    """),
    "a mean rescaled in place": (MEAN, """
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss = loss / 4
            loss.backward()
    """),
    "batchmean with a temperature": (MEAN, """
        T = 4
        for x, y in loader:
            loss = F.kl_div(a, b, reduction='batchmean') * T * T
            loss.backward()
    """),
    "Python's sum over the batch's samples": (UNCLEAR, """
        for x, y in loader:
            loss = sum(F.mse_loss(o, t) for o, t in zip(model(x), y))
            loss.backward()
    """),
    "Python's sum over a model's outputs (heads or rows?)": (UNCLEAR, """
        for x, y in loader:
            loss = sum(F.cross_entropy(out, y) for out in model(x))
            loss.backward()
    """),
    "Python's sum of a list the loop collects": (UNCLEAR, """
        for x, y in loader:
            losses = []
            for o, t in zip(model(x), y):
                losses.append(F.l1_loss(o, t))
            loss = sum(losses)
            loss.backward()
    """),
    "Python's sum of a list a comprehension makes": (UNCLEAR, """
        for x, y in loader:
            losses = [F.mse_loss(o, t) for o, t in zip(model(x), y)]
            loss = sum(losses)
            loss.backward()
    """),
    "Python's sum of a list of terms written out": (MEAN, """
        for x, y in loader:
            out = model(x)
            terms = [F.cross_entropy(out, y), F.nll_loss(out, y)]
            loss = sum(terms)
            loss.backward()
    """),
    "Python's sum of terms written out": (MEAN, """
        for x, y in loader:
            out = model(x)
            loss = sum([F.cross_entropy(out, y), 0.1 * F.nll_loss(out, y)])
            loss.backward()
    """),
    "Python's sum over a fixed number of heads": (MEAN, """
        for x, y in loader:
            heads = model(x)
            loss = sum(F.cross_entropy(heads[i], y) for i in range(3))
            loss.backward()
    """),
    "a lambda criterion that sums": (SUM, """
        criterion = lambda out, target: ((out - target) ** 2).sum()
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
    """),
    "a mean plus a weight penalty summed over the parameters": (MEAN, """
        for x, y in loader:
            penalty = 0
            for weight in model.parameters():
                penalty += torch.mean(torch.sum(weight ** 2))
            loss = F.mse_loss(model(x), y) + 1e-3 * penalty
            loss.backward()
    """),
    "a sum plus a weight penalty": (SUM, """
        for x, y in loader:
            penalty = 0
            for weight in model.parameters():
                penalty = penalty + weight.pow(2).sum()
            loss = F.mse_loss(model(x), y, reduction='sum') + 0.5 * penalty
            loss.backward()
    """),
    "reduction= named by a constant of the file": (SUM, """
        REDUCTION = 'sum'
        criterion = nn.CrossEntropyLoss(reduction=REDUCTION)
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
    """),
}


@pytest.mark.parametrize("expected, body", list(READINGS.values()), ids=list(READINGS))
def test_the_reduction_of_the_loss_that_reaches_backward(expected, body):
    script = ScriptModel.of(cst.parse_module(HEAD + textwrap.dedent(body)))
    (step,) = script.training_steps
    assert backward_reduction(script, step.backward) == expected


# -- accumulate ---------------------------------------------------------------------------

LOOP = """\
import torch
import torch.nn as nn
criterion = nn.CrossEntropyLoss({arguments})
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize(
    "arguments, backward, codes",
    [
        ("", "(loss / group_size).backward()", ["AM600"]),
        ("reduction='sum'", "    loss.backward()", ["AM600"]),
        ("reduction=kind", "    loss.backward()", ["AM607"]),
    ],
)
def test_accumulate_divides_a_mean_only(arguments, backward, codes):
    source = LOOP.format(arguments=arguments)
    result = migrate_source(source, [("accumulate", {"value": "2"})])
    assert [f.code for f in result.findings] == codes
    assert backward in result.code
    if codes == ["AM607"]:
        assert result.code == source


SUM_TRAIN = '''\
"""A classifier whose loss sums over the batch (`reduction="sum"`), scaled by
the data set's size; deterministic data, `shuffle=False` and SGD."""

import argparse
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(128, 12, generator=generator)
    dataset = TensorDataset(x, (x[:, :3].sum(dim=1) > 0).long())

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 2))
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    criterion = nn.CrossEntropyLoss(reduction="sum")

    for epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y) / len(dataset)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} last batch loss {loss.item():.6f}")
    torch.save(model.state_dict(), os.path.join(args.out_dir, "weights.pt"))


if __name__ == "__main__":
    main()
'''


def write_migration(directory: Path, name: str, plan: list) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / name
    script.write_text(migrate_source(SUM_TRAIN, plan, name).code if plan else SUM_TRAIN)
    return script


def trained_weights(script: Path, out_dir: Path, batch_size: int) -> dict:
    out_dir.mkdir()
    done = run_python(script, "--out-dir", str(out_dir), "--batch-size", str(batch_size), env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    return torch.load(out_dir / "weights.pt")


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[key] - b[key]).abs().max().item() for key in a)


@pytest.fixture(scope="module")
def original_weights(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("original")
    return trained_weights(write_migration(work, "train.py", []), work / "out", 32)


@pytest.mark.slow
def test_accumulated_halves_of_a_summed_batch_end_with_the_big_batch_weights(tmp_path, original_weights):
    """Batch 32 against accumulate=2 over batches of 16; the loss divided by
    the group's size (the migration before it read the reduction) trains at
    half the learning rate and ends elsewhere."""
    migrated = write_migration(tmp_path / "migrated", "train.py", [("accumulate", {"value": "2"})])
    assert "    loss.backward()" in migrated.read_text()
    accumulated = trained_weights(migrated, tmp_path / "accumulated", 16)
    assert largest_difference(original_weights, accumulated) <= TOLERANCE

    divided = tmp_path / "divided" / "train.py"
    divided.parent.mkdir()
    divided.write_text(migrated.read_text().replace("    loss.backward()", "    (loss / group_size).backward()"))
    assert largest_difference(original_weights, trained_weights(divided, tmp_path / "divided_out", 16)) > 100 * TOLERANCE


def launched_weights(script: Path, out_dir: Path) -> dict:
    out_dir.mkdir()
    done = run_cli(
        "run", "--nproc-per-node", "2", str(script), "--", "--batch-size", "32", "--out-dir", str(out_dir),
        cwd=script.parent, env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return torch.load(out_dir / "weights.pt")


@pytest.mark.slow
def test_two_ranks_of_a_summed_loss_end_with_the_one_process_weights(tmp_path, original_weights):
    """`--to ddp` keeps the global batch (16 per rank, the ranks' shares of
    each batch of 32): the ranks' summed gradients add up to the original's.
    Averaged, as DDP does by default, they are half of it."""
    migrated = write_migration(tmp_path / "migrated", "train.py", [("ddp", {})])
    text = migrated.read_text()
    hook = "        sum_gradients_across_ranks(model)  # its loss sums over the batch\n"
    assert hook in text
    assert largest_difference(original_weights, launched_weights(migrated, tmp_path / "summed")) <= TOLERANCE

    averaged = write_migration(tmp_path / "averaged", "train.py", [("ddp", {})])
    averaged.write_text(text.replace(hook, ""))
    assert largest_difference(original_weights, launched_weights(averaged, tmp_path / "averaged_out")) > 100 * TOLERANCE

    one_process = trained_weights(migrated, tmp_path / "one", 32)  # plain python: a world of one, the model bare
    assert largest_difference(original_weights, one_process) <= TOLERANCE


SUMMED_ELSEWHERE = {
    "a lambda that sums": 'criterion = lambda out, target: ((out.softmax(dim=1) - F.one_hot(target, 2)) ** 2).sum()',
    "a reduction named by a constant": 'criterion = nn.CrossEntropyLoss(reduction=REDUCTION)',
}


@pytest.mark.slow
@pytest.mark.parametrize("criterion", list(SUMMED_ELSEWHERE.values()), ids=list(SUMMED_ELSEWHERE))
def test_two_ranks_of_a_loss_summed_in_other_spellings_end_with_the_one_process_weights(tmp_path, criterion):
    source = SUM_TRAIN.replace('criterion = nn.CrossEntropyLoss(reduction="sum")', criterion).replace(
        "import torch.nn as nn\n", 'import torch.nn as nn\nimport torch.nn.functional as F\n\nREDUCTION = "sum"\n'
    )
    original = tmp_path / "original" / "train.py"
    original.parent.mkdir()
    original.write_text(source)
    migrated = tmp_path / "migrated" / "train.py"
    migrated.parent.mkdir()
    migrated.write_text(migrate_source(source, [("ddp", {})], "train.py").code)
    assert "sum_gradients_across_ranks(model)" in migrated.read_text()
    weights = trained_weights(original, tmp_path / "one", 32)
    assert largest_difference(weights, launched_weights(migrated, tmp_path / "two")) <= TOLERANCE


SUMMED_BY_A_LOOP = SUM_TRAIN.replace(
    "            loss = criterion(model(x), y) / len(dataset)\n",
    "            loss = sum(F.cross_entropy(o[None], t[None]) for o, t in zip(model(x), y)) / len(dataset)\n",
).replace("import torch.nn as nn\n", "import torch.nn as nn\nimport torch.nn.functional as F\n")


@pytest.mark.parametrize("word, code", [("accumulate", "AM607"), ("ddp", "AM520"), ("accelerate", "AM823"), ("fabric", "AM923")])
def test_a_loss_summed_by_python_over_a_loop_is_refused_by_the_words_that_split_the_batch(word, code):
    """Each term a sample's loss: the batch's sum, which each of these words
    would average over its parts (half the gradient on two)."""
    plan = [("accumulate", {"value": "2"})] if word == "accumulate" else [(word, exact_options(word))]
    result = migrate_source(SUMMED_BY_A_LOOP, plan, "train.py")
    assert code in [f.code for f in result.findings if not f.fixed], result.findings
    assert result.code == SUMMED_BY_A_LOOP


@pytest.mark.slow
@pytest.mark.parametrize("words, batch_size", [("accumulate=2", "16"), ("ddp", "32")])
def test_verify_says_same_for_a_summed_loss(tmp_path, words, batch_size):
    """verify adds the micro-batches' losses up, and under ddp the ranks'
    losses too where the migration adds their gradients up (each rank's loss
    sums over its share: their mean is half the original's)."""
    script = write_migration(tmp_path, "train.py", [])
    (tmp_path / "out").mkdir()
    done = run_cli(
        "verify", str(script), "--to", words, "--steps", "6", "--", "--out-dir", "out", "--batch-size", batch_size,
        cwd=tmp_path, env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "same: 6 steps agree" in done.stdout


def test_the_summing_hook_leaves_a_bare_model_alone():
    """A world of one runs the bare model: nothing to register."""
    from accelmigrate.runtime.gradients import sum_gradients_across_ranks

    model = torch.nn.Linear(2, 2)
    sum_gradients_across_ranks(model)
    model(torch.ones(1, 2)).sum().backward()
    assert torch.equal(model.weight.grad, torch.ones(2, 2))


def test_ddp_and_accumulate_together_add_a_summed_loss_up_across_micro_batches_and_ranks():
    code = migrate_source(SUM_TRAIN, [("ddp", {}), ("accumulate", {"value": "2"})], "train.py").code
    assert "        sum_gradients_across_ranks(model)  # its loss sums over the batch\n" in code
    assert "with no_sync_unless(end_of_group, model):" in code
    assert "            loss.backward()\n" in code and "group_size).backward()" not in code
