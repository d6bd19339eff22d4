"""Gradients clipped or read through a function of the project (one of the
file, or of a module it imports) between a scaled backward and the step:
amp unscales first (`scaler.unscale_(optimizer)`), as for a direct
`clip_grad_norm_`, or float16 gradients would be clipped while they still
carry the loss scale."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from accelmigrate.engine.migrate import migrate_source, process_files
from conftest import run_python

HELPERS = '''\
import torch


def clip_gradient(optimizer, grad_clip):
    """Clamp every gradient the optimizer holds to [-grad_clip, grad_clip]."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                param.grad.data.clamp_(-grad_clip, grad_clip)


def describe(model):
    return sum(p.numel() for p in model.parameters())
'''

TRAIN = '''\
import torch
from torch import nn

from helpers import clip_gradient, describe


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    print(describe(model))
    for step in range(20):
        x = 0.1 * torch.randn(16, 4, device=device)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        clip_gradient(optimizer, 0.5)
        optimizer.step()
    print("weights %.4f" % model.weight.sum().item())


if __name__ == "__main__":
    main()
'''


def project(tmp_path: Path) -> Path:
    (tmp_path / "helpers.py").write_text(HELPERS)
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path / "train.py"


def migrated(script: Path, follow: bool = True) -> str:
    (result, *_) = process_files([str(script)], [("device", {}), ("amp", {})], jobs=1, follow_imports=follow, runtime=True)  # ACCELMIGRATE_PRECISION
    assert result.error is None, result.error
    return result.migrated


def test_a_helper_of_another_module_is_unscaled_for(tmp_path):
    text = migrated(project(tmp_path))
    assert "        scaler.unscale_(optimizer)\n        clip_gradient(optimizer, 0.5)\n" in text
    assert text.count("unscale_") == 1  # describe() reads no gradient


def test_a_helper_of_the_file_is_unscaled_for():
    source = TRAIN.replace("from helpers import clip_gradient, describe\n", textwrap.dedent(HELPERS).replace("import torch\n", "", 1))
    text = migrate_source(source, [("device", {}), ("amp", {})], "train.py").code
    assert "        scaler.unscale_(optimizer)\n        clip_gradient(optimizer, 0.5)\n" in text


@pytest.mark.slow
def test_with_float16_the_clipped_training_ends_where_the_original_does(tmp_path):
    """On the CPU with float16 forced: unscaled before the clamp, the weights
    end near the original's; clamped while scaled, every step is clipped to
    0.5 / 65536 and the model barely moves."""
    script = project(tmp_path)
    weights = {}
    for name, text in {"original": TRAIN, "unscaled": migrated(script), "scaled": migrated(script).replace("        scaler.unscale_(optimizer)\n", "")}.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "helpers.py").write_text(HELPERS)
        (folder / "train.py").write_text(text)
        done = run_python(folder / "train.py", env={"ACCELMIGRATE_PRECISION": "fp16"})
        assert done.returncode == 0, done.stderr
        weights[name] = float(re.search(r"weights (\S+)", done.stdout).group(1))
    assert abs(weights["unscaled"] - weights["original"]) < 0.005, weights
    assert abs(weights["scaled"] - weights["original"]) > 0.5, weights


def test_the_cache_answers_for_what_the_other_modules_say(tmp_path):
    script = project(tmp_path)
    cache = tmp_path / "cache"

    def unscales() -> bool:
        (result, *_) = process_files([str(script)], [("device", {}), ("amp", {})], jobs=1, follow_imports=True, cache_folder=cache)
        return "unscale_" in result.migrated

    assert unscales() and unscales()
    (script.parent / "helpers.py").write_text(HELPERS.replace("param.grad.data.clamp_(-grad_clip, grad_clip)", "pass"))
    assert not unscales()  # train.py is unchanged; what its module does is not
