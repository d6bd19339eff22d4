"""Losses torch refuses to compute under autocast: a binary cross-entropy on
probabilities (`F.binary_cross_entropy`, `nn.BCELoss`) raises at the first
step under CUDA autocast, so amp never moves one into its region (AM418),
however the loss reaches the step; its logits form migrates."""

from __future__ import annotations

import textwrap

import pytest

from accelmigrate.engine.migrate import migrate_source

STEP = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
{setup}

def train(model, loader, criterion, device):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss = {loss}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid()).to(device)
    loader = [(torch.randn(8, 4), torch.rand(8, 1))]
    train(model, loader, {criterion}, device)


if __name__ == "__main__":
    main()
"""

REFUSED = {
    "the functional form": ("", "F.binary_cross_entropy(out, y)", "None"),
    "a BCELoss made where the step is called": ("", "criterion(out, y)", "nn.BCELoss()"),
    "a BCELoss made in a function of its own": ("\ndef make_criterion():\n    return nn.BCELoss()\n", "criterion(out, y)", "make_criterion()"),
    "a helper of the file": ("\ndef bce(p, t):\n    return F.binary_cross_entropy(p, t, reduction='mean')\n", "bce(out, y) + 0.0", "None"),
}


@pytest.mark.parametrize("setup, loss, criterion", list(REFUSED.values()), ids=list(REFUSED))
def test_amp_leaves_the_step_and_says_why(setup, loss, criterion):
    source = STEP.format(setup=setup, loss=loss, criterion=criterion)
    result = migrate_source(source, [("amp", {})], "train.py")
    assert "AM418" in [f.code for f in result.findings if not f.fixed], result.findings
    assert "torch.autocast" not in result.code and "scaler" not in result.code


def test_an_evaluation_computing_one_is_left_in_float32():
    source = STEP.format(setup="", loss="criterion(out, y)", criterion="nn.BCEWithLogitsLoss()").replace(
        "    train(model, loader,", "    with torch.no_grad():\n        print(F.binary_cross_entropy(model(loader[0][0].to(device)), loader[0][1].to(device)))\n    train(model, loader,"
    )
    result = migrate_source(source, [("amp", {})], "train.py")
    assert [f.code for f in result.findings if not f.fixed] == ["AM418"]
    assert "with torch.no_grad():\n" in result.code  # the evaluation block keeps no autocast
    assert "scaler.scale(loss).backward()" in result.code  # the training step is migrated


def test_the_logits_form_is_migrated():
    source = STEP.format(setup="", loss="criterion(out, y)", criterion="nn.BCEWithLogitsLoss()")
    result = migrate_source(source, [("amp", {})], "train.py")
    assert "AM418" not in [f.code for f in result.findings]
    assert "torch.autocast" in result.code and "scaler.scale(loss).backward()" in result.code
