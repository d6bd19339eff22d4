"""The speed codemods (compile, tf32, cudnn-benchmark, channels-last,
fused-optim, safe-load), their run-time gates, and the presets.

Each migrated script is run on the CPU against what it was before the speed
words: with the gates at their defaults (off on a CPU) the numbers are the
same to the printed digit; with compile and channels-last forced on, the
final loss agrees within 1e-4 and the checkpoint keeps the module's keys."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accelmigrate.codemods import ORDER, PRESETS, UnknownCodemod, find, parse_words, resolve
from accelmigrate.engine.migrate import migrate_source
from accelmigrate.output.explain import page
from accelmigrate.runtime import speed

from conftest import SCRIPTS, run_cli, run_python
from launching import Launch

SPEED_WORDS = ("channels-last", "fused-optim", "compile", "tf32", "cudnn-benchmark", "safe-load")
FINAL_LOSS = re.compile(r"final loss: (\S+)")
ACCURACY = re.compile(r"accuracy: (\S+)")
CONVNET = SCRIPTS / "speed_convnet.py"


def plan(spec: str):
    return [(cls.word, options) for cls, options in resolve(parse_words(spec))]


def migrated(script: Path, spec: str, folder: Path) -> Path:
    migration = migrate_source(script.read_text(encoding="utf-8"), plan(spec), str(script))
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / script.name
    target.write_text(migration.code, encoding="utf-8")
    return target


def final_loss(completed: subprocess.CompletedProcess) -> float:
    assert completed.returncode == 0, completed.stderr[-3000:]
    return float(FINAL_LOSS.search(completed.stdout).group(1))


# -- the run-time gates -----------------------------------------------------------------------


def test_gates_leave_a_cpu_run_alone(monkeypatch):
    for variable in (speed.COMPILE_VARIABLE, speed.CHANNELS_LAST_VARIABLE, speed.FUSED_VARIABLE):
        monkeypatch.delenv(variable, raising=False)
    model = torch.nn.Conv2d(3, 4, 3)
    images = torch.randn(2, 3, 8, 8)
    assert speed.should_compile(model) is False
    assert speed.fused_on_cuda(model) is False
    assert speed.to_channels_last(model) is model and model.weight.is_contiguous()
    assert speed.to_channels_last(images) is images


def test_switches_force_compile_and_channels_last_on_a_cpu(monkeypatch):
    monkeypatch.setenv(speed.COMPILE_VARIABLE, "1")
    monkeypatch.setenv(speed.CHANNELS_LAST_VARIABLE, "1")
    monkeypatch.setenv(speed.FUSED_VARIABLE, "1")
    model = torch.nn.Conv2d(3, 4, 3)
    assert speed.should_compile(model) is True
    assert speed.to_channels_last(model).weight.is_contiguous(memory_format=torch.channels_last)
    converted = speed.to_channels_last(torch.randn(2, 3, 8, 8))
    assert converted.is_contiguous(memory_format=torch.channels_last)
    flat = torch.randn(2, 3)
    assert speed.to_channels_last(flat) is flat  # only 4-D tensors have that layout
    assert speed.fused_on_cuda(model) is False  # CPU parameters keep the default optimizer


def test_switch_rejects_other_values(monkeypatch):
    monkeypatch.setenv(speed.COMPILE_VARIABLE, "maybe")
    with pytest.raises(ValueError, match="ACCELMIGRATE_COMPILE"):
        speed.should_compile(torch.nn.Linear(2, 2))


def test_tf32_touches_cuda_matmuls_only():
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "import torch\n"
        "from accelmigrate.runtime.speed import use_tf32_matmul\n"
        "use_tf32_matmul()\n"
        "print(torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision)\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["tf32", "none"]


# -- presets and order --------------------------------------------------------------------------


def test_presets_expand_to_their_words():
    assert list(parse_words("fast")) == list(PRESETS["fast"])
    assert set(PRESETS["fast"]) == set(PRESETS["checklist"]) | set(SPEED_WORDS)
    assert parse_words("checklist,accumulate=4")["accumulate"] == {"value": "4"}
    with pytest.raises(UnknownCodemod, match="takes no value"):
        parse_words("fast=2")


def test_checklist_runs_what_it_names_and_what_they_need():
    words = [cls.word for cls, _ in resolve(parse_words("checklist"))]
    assert words == ["modernize", "main-guard", "workers", "item", "empty-cache", "device", "amp"]


def test_speed_words_run_in_order():
    position = {word: ORDER.index(word) for word in (*SPEED_WORDS, "device", "ddp", "sync-bn")}
    assert position["device"] < position["channels-last"] < position["ddp"]
    assert position["sync-bn"] < position["compile"]


def test_cli_accepts_presets(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(CONVNET.read_text(encoding="utf-8"), encoding="utf-8")
    completed = run_cli("apply", str(script), "--to", "fast", "--diff", "--no-cache")
    assert completed.returncode == 1, completed.stderr  # changes pending
    for added in ("should_compile(model)", "fused=fused_on_cuda(model)", "use_tf32_matmul()", "weights_only=True"):
        assert added in completed.stdout


@pytest.mark.parametrize("word", SPEED_WORDS)
def test_explain_shows_the_documentation(word: str):
    cls = find(word)
    documentation = page(cls)
    assert documentation.startswith(f"{word}:")
    for part in ("What it does", "Why", "Example", "Left alone"):
        assert part in documentation
    for code in cls.codes:
        assert code in documentation, f"{code} is not explained"
    completed = run_cli("explain", word)
    assert completed.returncode == 0 and "Left alone" in completed.stdout


# -- end to end on the CPU ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("word", SPEED_WORDS)
def test_each_speed_word_keeps_the_result(word: str, tmp_path: Path):
    """The conv net, migrated with the checklist and then with one speed word
    more, prints the same loss and accuracy on a CPU."""
    baseline = migrated(CONVNET, "checklist", tmp_path / "checklist")
    sped = migrated(CONVNET, f"checklist,{word}", tmp_path / word)
    migration = migrate_source(baseline.read_text(encoding="utf-8"), plan(word), str(baseline))
    assert any(f.fixed and f.word == word for f in migration.findings), f"{word} changed nothing in the conv net"
    before = run_python(baseline, str(tmp_path / "before.pt"))
    after = run_python(sped, str(tmp_path / "after.pt"))
    assert final_loss(after) == final_loss(before)
    assert ACCURACY.search(after.stdout).group(1) == ACCURACY.search(before.stdout).group(1)


@pytest.mark.slow
def test_compiled_and_channels_last_on_a_cpu_save_the_module_keys(tmp_path: Path):
    """Forced on, compile (inductor on the CPU) and channels-last train to the
    original's loss within 1e-4, and the checkpoint has no `_orig_mod.` keys."""
    original_checkpoint, migrated_checkpoint = tmp_path / "original.pt", tmp_path / "migrated.pt"
    before = run_python(CONVNET, str(original_checkpoint))
    sped = migrated(CONVNET, "device,channels-last,compile,safe-load", tmp_path / "sped")
    forced = {speed.COMPILE_VARIABLE: "1", speed.CHANNELS_LAST_VARIABLE: "1"}
    after = run_python(sped, str(migrated_checkpoint), env=forced, timeout=600)
    assert final_loss(after) == pytest.approx(final_loss(before), rel=1e-4, abs=1e-5)
    keys = list(torch.load(migrated_checkpoint, weights_only=True)["model"])
    assert keys == list(torch.load(original_checkpoint, weights_only=True)["model"])
    assert not any(key.startswith("_orig_mod.") for key in keys)


# Arguments the bundled scripts need (paths they write go to the test's folder).
SCRIPT_ARGUMENTS = {
    "accum_ddp_train.py": lambda out: ["--out-dir", str(out)],
    "accum_train.py": lambda out: ["--out-dir", str(out)],
    "ddp_checkpoint_reload.py": lambda out: ["--out", str(out / "result.json")],
    "dp_parity.py": lambda out: ["--out", str(out / "result.json")],
    "gan_tutorial.py": lambda out: ["--out", str(out / "result.json")],
    "ddp_plain_flat.py": lambda out: [str(out / "result.json")],
    "ddp_actor_critic_sgd.py": lambda out: [str(out / "result.json")],
    "ddp_early_exit.py": lambda out: [str(out / "result.json")],
    "ddp_distill_aux.py": lambda out: [str(out / "result.json")],
    "speed_convnet.py": lambda out: [str(out / "checkpoint.pt")],
}


def bundled_scripts():
    return sorted(p.name for p in SCRIPTS.glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("name", bundled_scripts())
def test_fast_runs_every_bundled_script(name: str, tmp_path: Path):
    """`--to fast` against `--to checklist`: the speed words add nothing that
    fails on a CPU, and a script that prints its final loss prints the same."""
    script = SCRIPTS / name
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    runs = {}
    for spec in ("checklist", "fast"):  # both at once: two cores, half the time
        out = tmp_path / f"{spec}-out"
        out.mkdir()
        arguments = SCRIPT_ARGUMENTS.get(name, lambda _: [])(out)
        copy = migrated(script, spec, tmp_path / spec)
        runs[spec] = Launch(tmp_path, spec, [sys.executable, str(copy), *arguments], env, copy.parent)
    checklist, fast = (runs[spec].wait() for spec in ("checklist", "fast"))
    assert fast.returncode == checklist.returncode, fast.stderr[-3000:]
    if checklist.returncode == 0 and FINAL_LOSS.search(checklist.stdout):
        assert final_loss(fast) == final_loss(checklist)
