"""A GAN's noise under `--to accelerate` and `--to fabric`
(codemods/_accelerate/draws.py).

- fast: the noise sized by the batch is drawn for the global batch and each
  process keeps its rows (Accelerate's contiguous slice, Fabric's every
  world-size-th row); a draw of a fixed size is still refused;
- end to end (slow): fixtures/<word>/gan_noise_flat.py (two models, two
  optimizers, BCE, `fake.detach()` for the discriminator) migrated and run
  as plain `python` prints the original's loss lines, and on 2 CPU
  processes under torchrun (gloo) ends with the original's weights of both
  models within 1e-5.
"""

from __future__ import annotations

import shutil
import sys

import pytest
import torch
from conftest import FIXTURES, PARITY, SCRIPTS, exact, exact_options, run_cli
from launching import (
    ONE_PROCESS_TOLERANCE,
    cpu_env,
    largest_parameter_difference,
    launch_all,
    on_two,
)

from accelmigrate.engine.migrate import migrate_source

WORDS = ("accelerate", "fabric")
NOTES = {"accelerate": {"AM810", "AM811", "AM816"}, "fabric": {"AM910", "AM911", "AM916"}}
# Each launcher's variables for a CPU run: Accelerate is told to use the CPU, Fabric needs nothing.
ENVIRONMENTS = {"accelerate": cpu_env(ACCELERATE_USE_CPU="true"), "fabric": cpu_env()}
ROWS = {
    "accelerate": "torch.randn(b_size * accelerator.num_processes, nz, device=device).split(b_size)[accelerator.process_index]",
    "fabric": "torch.randn(b_size * fabric.world_size, nz, device=device)[fabric.global_rank::fabric.world_size]",
}


def _migrated(word: str, case: str) -> object:
    return migrate_source((FIXTURES / word / f"{case}.py").read_text(), [(word, exact_options(word))], "train.py")


@pytest.mark.parametrize("word", WORDS)
def test_the_batch_noise_is_this_processs_rows_of_the_global_draw(word):
    result = _migrated(word, "gan_noise_flat")
    assert ROWS[word].replace(" ", "") in "".join(result.code.split()), result.code
    assert "fixed_noise = torch.randn(4, nz, device=device)" in result.code  # drawn once, before the loop


@pytest.mark.parametrize("word", WORDS)
def test_a_draw_of_a_fixed_size_in_the_loop_is_still_refused(word):
    source = (FIXTURES / word / "gan_noise_fixed_size.py").read_text()
    result = migrate_source(source, [(word, exact_options(word))], "train.py")
    assert result.code == source
    assert any(f.code == ("AM831" if word == "accelerate" else "AM931") for f in result.findings)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("gan-noise")
    original = work / "original.py"
    shutil.copy(FIXTURES / "accelerate" / "gan_noise_flat.py", original)
    plans = {"original": [sys.executable, str(original)]}
    for word in WORDS:
        migrated = work / f"gan_{word}.py"  # not accelerate.py: it would shadow the package
        shutil.copy(FIXTURES / word / "gan_noise_flat.py", migrated)
        applied = run_cli("apply", str(migrated), "--to", exact(word), cwd=work)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        plans[f"{word}-one"] = [sys.executable, str(migrated)]
        plans[f"{word}-two"] = on_two(migrated)
    launched, folders = {}, {}
    for word in WORDS:  # one launch_all per environment; the original runs with accelerate's
        chosen = {name: command for name, command in plans.items() if name.startswith(word) or name == "original" and word == "accelerate"}
        (work / word).mkdir()
        done, where = launch_all(work / word, chosen, ENVIRONMENTS[word])
        launched.update(done)
        folders.update(where)
    return launched, folders


def _weights(folder) -> list[torch.Tensor]:
    saved = torch.load(folder / "gan.pt")
    return [tensor for model in ("netG", "netD") for tensor in saved[model].values()]


@pytest.mark.slow
@pytest.mark.parametrize("word", WORDS)
def test_under_plain_python_the_migrated_gan_prints_the_originals_losses(runs, word):
    launched, _ = runs
    original, migrated = launched["original"].succeeded(), launched[f"{word}-one"].succeeded()
    assert original.stdout.count("Loss_D") == 3
    assert migrated.stdout == original.stdout


@pytest.mark.slow
@pytest.mark.parametrize("word", WORDS)
def test_on_two_processes_the_migrated_gan_ends_with_the_originals_weights(runs, word):
    launched, folders = runs
    launched["original"].succeeded()
    launched[f"{word}-two"].succeeded()
    assert launched[f"{word}-two"].stdout.count("Loss_D") == 3  # printed once
    difference = largest_parameter_difference(_weights(folders["original"]), _weights(folders[f"{word}-two"]))
    assert difference <= ONE_PROCESS_TOLERANCE, difference


@pytest.mark.parametrize(("word", "code"), [("accelerate", "AM816"), ("fabric", "AM916")])
def test_a_model_with_dropout_is_noted(word, code):
    result = _migrated(word, "gan_noise_dropout")
    assert [f.code for f in result.findings if f.code == code] == [code]


def test_noise_behind_a_dispatched_shuffled_loader_is_noted():
    source = (FIXTURES / "accelerate" / "gan_noise_flat.py").read_text().replace("batch_size=16)", "batch_size=16, shuffle=True)")
    result = migrate_source(source, [("accelerate", PARITY)], "train.py")
    assert "dispatch_batches=True" in result.code and ".split(b_size)" in result.code
    assert any(f.code == "AM816" and "shuffled loader" in f.message for f in result.findings)


@pytest.mark.parametrize(("word", "code"), [("accelerate", "AM815"), ("fabric", "AM915")])
def test_the_bundled_gan_tutorial_is_migrated_not_refused(word, code):
    result = migrate_source((SCRIPTS / "gan_tutorial.py").read_text(), [(word, exact_options(word))], "train.py")
    assert [f.code for f in result.findings if f.code == code] == [code]
    assert not [f for f in result.findings if not f.fixed and f.code not in NOTES[word]]


BATCH_NORM_SCRIPT = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16, drop_last=True)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
    CONVERT
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize(("word", "code"), [("accelerate", "AM817"), ("fabric", "AM917")])
def test_a_model_with_batch_norm_is_noted_unless_the_file_converts_it(word, code):
    """Each process's BatchNorm statistics are its slice's: a note, as ddp's AM538."""
    plain = migrate_source(BATCH_NORM_SCRIPT.replace("CONVERT", "pass"), [(word, exact_options(word))], "train.py")
    assert [(f.line, f.code) for f in plain.findings if f.code == code] == [(8, code)]
    assert "convert_sync_batchnorm" in next(f.message for f in plain.findings if f.code == code)
    converted = BATCH_NORM_SCRIPT.replace("CONVERT", "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)")
    assert not [f for f in migrate_source(converted, [(word, exact_options(word))], "train.py").findings if f.code == code]
