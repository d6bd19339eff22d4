"""`accelmigrate verify`: the original and a migrated copy, run side by side.

Each test runs real scripts (the bundled ones) in child processes; a planted
broken migration must be named at the step where it parts."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from accelmigrate.files.sources import SourceText
from accelmigrate.launch import verify as verify_module
from accelmigrate.launch.verify import verify_command

from conftest import SCRIPTS, run_verify

pytestmark = pytest.mark.slow


def copy_script(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    target.write_text((SCRIPTS / name).read_text())
    return target


@pytest.mark.parametrize(
    "name, words, args",
    [
        ("mlp_classifier.py", "workers,item", []),
        ("char_lstm.py", "modernize,workers,item,empty-cache", []),
        ("flat_tutorial.py", "workers,item", []),
        ("trainer_class.py", "workers,item,empty-cache", []),
        ("amp_conv_onecycle.py", "device,amp", []),
    ],
)
def test_bundled_migrations_train_the_same(tmp_path, name, words, args):
    script = copy_script(tmp_path, name)
    code, result = run_verify(str(script), "--to", words, "--steps", "4", *args)
    assert code == 0, result
    assert result["verdict"] == "same"
    assert len(result["steps"]) == 4
    assert all(row["original_loss"] is not None for row in result["steps"])
    assert script.read_text() == (SCRIPTS / name).read_text()  # the user's file is never written
    assert [p.name for p in tmp_path.iterdir()] == [name]  # the migrated copy is gone


def plant(monkeypatch, change) -> None:
    """The migrated copy verify runs, changed by `change` (its text -> a new text)."""
    real = verify_module.migrated_copy

    def planted(script, words_spec, runtime=False):
        copy = real(script, words_spec, runtime)
        code = change(copy.migrated.text)
        assert code != copy.migrated.text
        return dataclasses.replace(copy, migrated=SourceText(code, copy.migrated.encoding))

    monkeypatch.setattr(verify_module, "migrated_copy", planted)


def test_a_planted_break_is_named_at_its_step(tmp_path, monkeypatch):
    script = copy_script(tmp_path, "mlp_classifier.py")
    # From the third optimizer step on, the loss is doubled.
    plant(monkeypatch, lambda code: code.replace(
        "            loss.backward()",
        "            broken_steps.append(1)\n"
        "            if len(broken_steps) >= 3:\n"
        "                loss = loss * 2\n"
        "            loss.backward()",
    ).replace("import torch\n", "import torch\nbroken_steps = []\n", 1))
    code, result = run_verify(str(script), "--to", "workers", "--steps", "5")
    assert code == 1
    assert result["verdict"] == "differ"
    assert result["first_differing_step"] == 3
    assert "loss" in result["reason"]
    first_two = result["steps"][:2]
    assert all(row["original_loss"] == row["migrated_loss"] for row in first_two)


def test_text_output_names_the_first_differing_step(tmp_path, monkeypatch):
    script = copy_script(tmp_path, "mlp_classifier.py")
    plant(monkeypatch, lambda code: code.replace("lr=", "lr=1.5 * "))
    result = CliRunner().invoke(verify_command, [str(script), "--to", "workers", "--steps", "3"])
    assert result.exit_code == 1
    assert "differ: from step 1: the weights after the step differ" in result.output


def test_accumulation_matches_the_big_batch_original(tmp_path):
    script = copy_script(tmp_path, "accum_train.py")
    out = tmp_path / "out"
    out.mkdir()
    code, result = run_verify(str(script), "--to", "accumulate=4", "--steps", "3", "--", "--out-dir", str(out))
    assert code == 0, result
    assert result["reference_batch_scale"] == 4
    assert result["verdict"] == "same"


def test_bf16_autocast_is_compared_within_its_tolerance(tmp_path):
    script = copy_script(tmp_path, "amp_conv_onecycle.py")
    code, result = run_verify(
        str(script), "--to", "amp", "--steps", "3", "--runtime", env={"ACCELMIGRATE_PRECISION": "bf16"}
    )
    assert code == 0, result
    assert result["low_precision"] == ["bfloat16"]
    assert result["rtol"] == verify_module.LOW_PRECISION_RTOL["bfloat16"]
    differences = [row["relative_difference"] for row in result["steps"]]
    assert any(d > 0 for d in differences)  # bf16 really ran, and still agrees


def test_ddp_on_two_processes_matches_one(tmp_path):
    script = copy_script(tmp_path, "ddp_plain_flat.py")
    code, result = run_verify(str(script), "--to", "ddp", "--steps", "4", "--", str(tmp_path))
    assert code == 0, result
    assert result["processes"] == 2
    assert result["verdict"] == "same"


def test_ddp_without_gradient_averaging_is_caught(tmp_path, monkeypatch):
    script = copy_script(tmp_path, "ddp_plain_flat.py")
    plant(monkeypatch, lambda code: code.replace(
        "    if is_distributed():\n        model = DistributedDataParallel", "    if False:\n        model = DistributedDataParallel"
    ))
    code, result = run_verify(str(script), "--to", "ddp", "--steps", "3", "--", str(tmp_path))
    assert code == 1
    assert result["first_differing_step"] == 1
    assert "ranks' weights differ" in result["reason"]


def test_a_migration_that_changes_nothing_runs_nothing(tmp_path):
    script = copy_script(tmp_path, "fp16_clip.py")
    code, result = run_verify(str(script), "--to", "workers")
    assert code == 0
    assert result["verdict"] == "unchanged"


def test_a_failing_original_exits_2_and_says_which_run(tmp_path):
    script = copy_script(tmp_path, "mlp_classifier.py")
    script.write_text(script.read_text().replace("for epoch in range(3):", "raise RuntimeError('planted failure')\n    for epoch in range(3):"))
    result = CliRunner().invoke(verify_command, [str(script), "--to", "workers,item"])
    assert result.exit_code == 2
    assert "planted failure" in result.output
    assert str(script) in result.output


def test_batch_scale_cannot_be_verified(tmp_path):
    script = copy_script(tmp_path, "accum_batch_scale.py")
    result = CliRunner().invoke(verify_command, [str(script), "--to", "batch-scale=2"])
    assert result.exit_code == 2
    assert "batch-scale changes the training on purpose" in result.output


def test_the_command_line_runs_verify(tmp_path):
    import subprocess
    import sys

    script = copy_script(tmp_path, "mlp_classifier.py")
    completed = subprocess.run(
        [sys.executable, "-m", "accelmigrate", "verify", str(script), "--to", "item", "--steps", "2"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr
    assert "same: 2 steps agree" in completed.stdout


def test_ddp_with_a_shuffled_loader_takes_the_original_steps(tmp_path):
    # Six steps cross an epoch boundary: the second epoch's order is drawn anew.
    script = copy_script(tmp_path, "ddp_shuffled_parity.py")
    code, result = run_verify(str(script), "--to", "ddp", "--steps", "6")
    assert code == 0, result
    assert result["verdict"] == "same"
    assert len(result["steps"]) == 6
