"""The `amp` codemod's runtime (dtype choice, scaler) and migrated scripts run
end to end on the CPU: bf16 autocast against the fp32 reference, an apex
script that only runs once migrated, and fp16 with a GradScaler that unscales
before clipping. The fixture pairs (fixtures/amp) cover the rewrites."""

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from accelmigrate.engine import migrate_source
from accelmigrate.runtime.precision import PRECISION_VARIABLE, autocast_dtype, grad_scaler

from conftest import SCRIPTS, run_python

FINAL_LOSS = re.compile(r"final loss: (\S+)")
NORMS = re.compile(r"step (\d+) clip norm: (\S+) grad norm: (\S+)")
DEVICE_AND_AMP = [("device", {}), ("amp", {})]


# -- the runtime ----------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32), (" FP16 ", torch.float16), ("float32", torch.float32)],
)
def test_the_environment_variable_chooses_the_dtype(monkeypatch, value, expected):
    monkeypatch.setenv(PRECISION_VARIABLE, value)
    assert autocast_dtype(torch.device("cpu")) == expected
    assert autocast_dtype("cuda") == expected


def test_an_unknown_precision_is_an_error(monkeypatch):
    monkeypatch.setenv(PRECISION_VARIABLE, "fp8")
    with pytest.raises(ValueError, match="bf16, fp16, fp32"):
        autocast_dtype(torch.device("cpu"))


def test_the_cpu_computes_in_bfloat16(monkeypatch):
    monkeypatch.delenv(PRECISION_VARIABLE, raising=False)
    assert autocast_dtype(torch.device("cpu")) == torch.bfloat16
    assert autocast_dtype("cpu") == torch.bfloat16


def test_cuda_without_bf16_falls_back_to_float16(monkeypatch):
    monkeypatch.delenv(PRECISION_VARIABLE, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert autocast_dtype(torch.device("cuda", 0)) == torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert autocast_dtype(torch.device("cuda", 0)) == torch.bfloat16


@pytest.mark.parametrize("dtype, enabled", [(torch.float16, True), (torch.bfloat16, False), (torch.float32, False)])
def test_the_scaler_scales_only_float16(dtype, enabled):
    scaler = grad_scaler(torch.device("cpu"), dtype)
    assert isinstance(scaler, torch.amp.GradScaler)
    assert scaler.is_enabled() is enabled
    loss = torch.tensor(2.0, requires_grad=True)
    assert scaler.scale(loss).item() == (2.0 * 65536.0 if enabled else 2.0)


def test_the_migrated_autocast_line_runs_in_fp32_without_warnings(monkeypatch):
    """`enabled=amp_dtype != torch.float32`: CPU autocast rejects float32 as a dtype."""
    monkeypatch.setenv(PRECISION_VARIABLE, "fp32")
    device = torch.device("cpu")
    amp_dtype = autocast_dtype(device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
            product = torch.ones(2, 2) @ torch.ones(2, 2)
    assert product.dtype == torch.float32


def test_the_codemod_does_not_import_torch():
    code = "import sys, accelmigrate.codemods.amp; assert 'torch' not in sys.modules, 'torch imported'"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr


# -- migrated scripts, end to end ---------------------------------------------------


def migrate_script(name: str, tmp_path: Path) -> tuple[Path, str]:
    source = (SCRIPTS / name).read_text(encoding="utf-8")
    migration = migrate_source(source, DEVICE_AND_AMP, name)
    fixed = {f.code for f in migration.findings if f.fixed and f.word == "amp"}
    assert "AM401" in fixed, migration.findings
    path = tmp_path / name
    path.write_text(migration.code, encoding="utf-8")
    return path, migration.code


def final_loss(completed: subprocess.CompletedProcess) -> float:
    assert completed.returncode == 0, completed.stderr[-3000:]
    match = FINAL_LOSS.search(completed.stdout)
    assert match, completed.stdout
    return float(match.group(1))


@pytest.mark.slow
def test_cuda_only_script_trains_in_bf16_close_to_fp32(tmp_path):
    migrated, code = migrate_script("cuda_only.py", tmp_path)
    assert "torch.autocast(device_type=device.type, dtype=amp_dtype" in code
    bf16 = final_loss(run_python(migrated, env={PRECISION_VARIABLE: ""}))
    fp32 = final_loss(run_python(migrated, env={PRECISION_VARIABLE: "fp32"}))
    assert bf16 != fp32, "autocast changed nothing: the forward did not run in bfloat16"
    assert bf16 == pytest.approx(fp32, rel=0.02)


@pytest.mark.slow
def test_apex_script_runs_once_migrated(tmp_path):
    original = run_python(SCRIPTS / "apex_script.py")
    assert original.returncode != 0
    assert "No module named 'apex'" in original.stderr
    migrated, code = migrate_script("apex_script.py", tmp_path)
    assert "apex" not in code.split('"""', 2)[-1], "an apex reference is left"
    assert "scaler.scale(loss).backward()" in code and "scaler.unscale_(optimizer)" in code
    # fp16: the scaler is enabled, and its state goes through the checkpoint
    loss = final_loss(run_python(migrated, env={PRECISION_VARIABLE: "fp16"}))
    assert 0 < loss < 1.0


def clip_and_grad_norms(completed: subprocess.CompletedProcess) -> list[tuple[float, float]]:
    assert completed.returncode == 0, completed.stderr[-3000:]
    norms = [(float(clip), float(grad)) for _, clip, grad in NORMS.findall(completed.stdout)]
    assert len(norms) == 8, completed.stdout
    return norms


@pytest.mark.slow
def test_fp16_gradients_are_unscaled_before_clipping(tmp_path):
    migrated, code = migrate_script("fp16_clip.py", tmp_path)
    lines = code.splitlines(keepends=True)
    unscale = [i for i, line in enumerate(lines) if "scaler.unscale_(optimizer)" in line]
    clip = [i for i, line in enumerate(lines) if "clip_grad_norm_(" in line]
    assert len(unscale) == 1 and unscale[0] + 1 == clip[0]

    for clip_norm, grad_norm in clip_and_grad_norms(run_python(migrated, env={PRECISION_VARIABLE: "fp16"})):
        assert clip_norm == pytest.approx(grad_norm, rel=1e-5)

    # The same script without the unscale_ line: clipping sees the scaled gradients.
    without_unscale = tmp_path / "without_unscale.py"
    without_unscale.write_text("".join(lines[: unscale[0]] + lines[unscale[0] + 1:]), encoding="utf-8")
    for clip_norm, grad_norm in clip_and_grad_norms(run_python(without_unscale, env={PRECISION_VARIABLE: "fp16"})):
        assert clip_norm / grad_norm == pytest.approx(65536.0, rel=1e-3)
