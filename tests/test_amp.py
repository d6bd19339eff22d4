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

from accelmigrate.engine.migrate import migrate_source
from accelmigrate.runtime.precision import PRECISION_VARIABLE, autocast_dtype, full_precision, grad_scaler, scaler_for

from conftest import FIXTURES, SCRIPTS, run_python

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


def test_the_cpu_stays_in_float32_unless_bf16_is_asked_for(monkeypatch):
    monkeypatch.delenv(PRECISION_VARIABLE, raising=False)
    assert autocast_dtype(torch.device("cpu")) == torch.float32
    assert autocast_dtype("cpu") == torch.float32
    monkeypatch.setenv(PRECISION_VARIABLE, "bf16")
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


def test_the_scaler_takes_the_old_options_and_the_users_switch():
    scaler = grad_scaler("cpu", torch.float16, init_scale=1024.0, growth_interval=10)
    assert scaler.is_enabled() and scaler.get_scale() == 1024.0
    assert not grad_scaler("cpu", torch.float16, enabled=False).is_enabled()
    assert not grad_scaler("cpu", torch.bfloat16, enabled=True).is_enabled()


def test_an_optimizer_has_one_scaler_and_none_has_a_scaler_that_scales_nothing():
    model = torch.nn.Linear(2, 1)
    first, second = (torch.optim.SGD(model.parameters(), lr=0.1) for _ in range(2))
    scaler = scaler_for(first, "cpu", torch.float16)
    assert scaler.is_enabled() and scaler_for(first, "cpu", torch.float16) is scaler
    assert scaler_for(second, "cpu", torch.float16) is not scaler
    assert not scaler_for(None, "cpu", torch.float16).is_enabled()  # called without an optimizer
    assert not scaler_for(torch.optim.SGD(model.parameters(), lr=0.1), "cpu", torch.bfloat16).is_enabled()


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
    bf16 = final_loss(run_python(migrated, env={PRECISION_VARIABLE: "bf16"}))
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


# -- the CPU default (issue 8, item 15) and the old API on the policy (item 19) -----

ACCURACY = re.compile(r"accuracy: (\S+)")
EPOCH_LINE = re.compile(r"epoch \d+ loss: \S+ scale: (\S+) autocast: (\S+)")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # the same kernels in every run, and no contention


def loss_and_accuracy(completed: subprocess.CompletedProcess) -> tuple[float, float]:
    match = ACCURACY.search(completed.stdout)
    assert match, completed.stdout
    return final_loss(completed), float(match.group(1))


@pytest.mark.slow
def test_a_conv_net_with_a_one_cycle_schedule_keeps_its_numbers_on_the_cpu(tmp_path):
    """BatchNorm + OneCycleLR(max_lr=0.2), migrated with device,amp and run on a
    CPU with no setting: float32, so the same operations as the original and
    the same numbers (tolerance 1e-6, the printed precision). bf16 stays
    available on request and lands within 0.05 accuracy of it, the spread
    that float32 itself shows across seeds on such nets."""
    original = loss_and_accuracy(run_python(SCRIPTS / "amp_conv_onecycle.py", env=ONE_THREAD))
    migrated, _ = migrate_script("amp_conv_onecycle.py", tmp_path)
    default = loss_and_accuracy(run_python(migrated, env={**ONE_THREAD, PRECISION_VARIABLE: ""}))
    assert default[0] == pytest.approx(original[0], rel=1e-6, abs=1e-6)
    assert default[1] == original[1]
    bf16 = loss_and_accuracy(run_python(migrated, env={**ONE_THREAD, PRECISION_VARIABLE: "bf16"}))
    assert bf16[0] != original[0], "ACCELMIGRATE_PRECISION=bf16 changed nothing: autocast did not run"
    assert abs(bf16[1] - original[1]) <= 0.05


def scales_and_dtypes(completed: subprocess.CompletedProcess) -> set[tuple[float, str]]:
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = {(float(scale), dtype) for scale, dtype in EPOCH_LINE.findall(completed.stdout)}
    assert found, completed.stdout
    return found


@pytest.mark.slow
def test_the_old_cuda_amp_api_follows_the_runtimes_precision_on_a_cpu(tmp_path):
    """`torch.cuda.amp.autocast()` and `GradScaler()` migrate onto amp_dtype and
    grad_scaler: on a CPU float32 by default with the scaler off (scale 1), as
    the original ran there; bf16 on request, the scaler still off; the scaler
    on (scale 65536 at first) only for fp16."""
    original = run_python(SCRIPTS / "amp_old_api.py", env=ONE_THREAD)
    assert scales_and_dtypes(original) == {(1.0, "torch.float32")}
    migrated, code = migrate_script_with(tmp_path, "amp_old_api.py")
    assert "grad_scaler(device, amp_dtype)" in code and "from torch.cuda.amp" not in code
    default = run_python(migrated, env={**ONE_THREAD, PRECISION_VARIABLE: ""})
    assert scales_and_dtypes(default) == {(1.0, "torch.float32")}
    assert final_loss(default) == pytest.approx(final_loss(original), rel=1e-6, abs=1e-6)
    bf16 = run_python(migrated, env={**ONE_THREAD, PRECISION_VARIABLE: "bf16"})
    assert scales_and_dtypes(bf16) == {(1.0, "torch.bfloat16")}
    fp16 = scales_and_dtypes(run_python(migrated, env={**ONE_THREAD, PRECISION_VARIABLE: "fp16"}))
    assert {dtype for _, dtype in fp16} == {"torch.float16"} and all(scale > 1.0 for scale, _ in fp16)


def migrate_script_with(tmp_path: Path, name: str) -> tuple[Path, str]:
    """Migrate with device,amp where the step is native AMP already (AM404, no AM401)."""
    migration = migrate_source((SCRIPTS / name).read_text(encoding="utf-8"), DEVICE_AND_AMP, name)
    assert {f.code for f in migration.findings if f.fixed and f.word == "amp"} >= {"AM404"}, migration.findings
    path = tmp_path / name
    path.write_text(migration.code, encoding="utf-8")
    return path, migration.code


# -- a device and an optimizer passed in as arguments (issue 10, item 2) ---------------

@pytest.mark.slow
def test_a_train_function_that_receives_device_and_optimizer_trains_as_before(tmp_path):
    """`train(args, model, device, train_loader, optimizer, epoch)` called from
    main() every epoch: autocast inside train() from the device it receives,
    one scaler bound in main() and passed in. On a CPU with no setting the
    numbers are the original's (float32, tolerance 1e-6, the printed
    precision); bf16 and fp16 (scaler on, carried across epochs) run and
    stay within 2% of them."""
    case = FIXTURES / "amp" / "device_argument.py"
    original = loss_and_accuracy(run_python(case, env=ONE_THREAD, cwd=tmp_path))
    migration = migrate_source(case.read_text(encoding="utf-8"), [("amp", {})], str(case))
    assert {f.code for f in migration.findings if f.fixed and f.word == "amp"} == {"AM401", "AM402"}, migration.findings
    assert "scaler=scaler)" in migration.code and "def train(args, model, device, train_loader, optimizer, epoch, scaler):" in migration.code
    migrated = tmp_path / "device_argument.py"
    migrated.write_text(migration.code, encoding="utf-8")
    default = loss_and_accuracy(run_python(migrated, env={**ONE_THREAD, PRECISION_VARIABLE: ""}))
    assert default[0] == pytest.approx(original[0], rel=1e-6, abs=1e-6)
    assert default[1] == original[1]
    for precision in ("bf16", "fp16"):
        loss, _ = loss_and_accuracy(run_python(migrated, env={**ONE_THREAD, PRECISION_VARIABLE: precision}))
        assert loss != original[0], f"{precision}: autocast changed nothing"
        assert loss == pytest.approx(original[0], rel=0.02)


# -- the device where real scripts keep it, and values leaving for numpy (issue 10, item 2) --


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_full_precision_casts_reduced_tensors_and_leaves_the_rest(dtype):
    reduced = torch.tensor([0.5, 1.5], dtype=dtype)
    assert full_precision(reduced).dtype == torch.float32
    assert full_precision(reduced).numpy().tolist() == [0.5, 1.5]
    as_list = full_precision([reduced, [reduced]])
    assert as_list[0].dtype == torch.float32 and as_list[1][0].dtype == torch.float32
    labels = torch.tensor([1, 2])
    single = torch.ones(2)
    assert full_precision(labels) is labels and full_precision(single) is single
    assert full_precision(3.5) == 3.5 and full_precision((single,))[0] is single


DEVICE_SOURCES = ["no_device.py", "vae_no_device.py", "args_device.py", "self_device_param.py", "parameters_device.py", "self_optimizer_param.py", "cpu_named_only.py", "self_device_string_from_args.py", "args_device_flag.py", "device_default_redefined.py", "gpu_index_worker.py", "optimizer_rebinds_module_alias.py"]


def migrate_fixture(name: str, tmp_path: Path, source: str | None = None) -> tuple[Path, str]:
    case = FIXTURES / "amp" / name
    migration = migrate_source(source or case.read_text(encoding="utf-8"), [("amp", {})], str(case))
    assert "AM401" in {f.code for f in migration.findings if f.fixed and f.word == "amp"}, migration.findings
    path = tmp_path / name
    path.write_text(migration.code, encoding="utf-8")
    return path, migration.code


@pytest.mark.slow
@pytest.mark.parametrize("name", DEVICE_SOURCES)
def test_a_script_gets_autocast_on_the_device_it_keeps_and_trains_as_before(name, tmp_path):
    """No device at all (CPU), `args.device`, `self.device = device` and
    `next(model.parameters()).device`: with no setting on a CPU, float32, so
    the migrated script prints exactly what the original printed; with
    ACCELMIGRATE_PRECISION=bf16 autocast runs, every value that reaches
    numpy is cast back, and the final loss stays within 3% of the original."""
    original = run_python(FIXTURES / "amp" / name, env=ONE_THREAD, cwd=tmp_path)
    migrated, _ = migrate_fixture(name, tmp_path)
    default = run_python(migrated, env={**ONE_THREAD, PRECISION_VARIABLE: ""})
    assert default.returncode == 0, default.stderr[-3000:]
    assert default.stdout == original.stdout
    bf16 = final_loss(run_python(migrated, env={**ONE_THREAD, PRECISION_VARIABLE: "bf16"}))
    assert bf16 != final_loss(original), "ACCELMIGRATE_PRECISION=bf16 changed nothing: autocast did not run"
    assert bf16 == pytest.approx(final_loss(original), rel=0.03)


# torchvision's image writers as far as a tensor goes in them (torchvision is
# not among the test dependencies): `to_pil_image` reads the tensor with
# `pic.numpy(force=True)` first, `save_image` scales it to uint8 on the way
# to numpy.
IMAGE_WRITERS = {
    "torchvision/__init__.py": "",
    "torchvision/utils.py": (
        "import torch\n\n\ndef save_image(tensor, fp):\n"
        "    return tensor.mul(255).add_(0.5).clamp_(0, 255).to('cpu', torch.uint8).numpy()\n"
    ),
    "torchvision/transforms/__init__.py": "class ToPILImage:\n    def __call__(self, pic):\n        return pic.numpy(force=True)\n",
}


@pytest.mark.slow
def test_samples_computed_under_bf16_autocast_reach_the_image_writers_cast_back(tmp_path):
    """Issue 29, item 9: an evaluation block run under autocast hands its
    samples to `save_image` and `ToPILImage()`; migrated, the script runs in
    bf16 (with the casts suppressed it fails in the writer) and ends within
    3% of the original's loss."""
    for name, text in IMAGE_WRITERS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    source = (FIXTURES / "amp" / "sampled_images.py").read_text(encoding="utf-8")
    original = tmp_path / "original.py"
    original.write_text(source)
    migrated, code = migrate_fixture("sampled_images.py", tmp_path)
    assert "save_image(full_precision(sample.view(4, 1, 8, 8))" in code
    uncast = tmp_path / "uncast.py"
    marked = re.sub(r"(save_image|ToPILImage)(.*)\n", r"\1\2  # accelmigrate: skip[AM407]\n", source)
    uncast.write_text(migrate_source(marked, [("amp", {})], str(uncast)).code)
    assert "full_precision(" not in uncast.read_text()
    failed = run_python(uncast, env={**ONE_THREAD, PRECISION_VARIABLE: "bf16"})
    assert failed.returncode != 0 and "BFloat16" in failed.stderr, failed.stderr[-2000:]
    bf16 = final_loss(run_python(migrated, env={**ONE_THREAD, PRECISION_VARIABLE: "bf16"}))
    assert bf16 == pytest.approx(final_loss(run_python(original, env=ONE_THREAD)), rel=0.03)


@pytest.mark.slow
def test_a_value_computed_under_bf16_autocast_reaches_numpy_cast_back(tmp_path):
    """The held-out failure: `fitted.data.numpy()` of a value computed under
    bf16 autocast raised "Got unsupported ScalarType BFloat16". Migrated with
    the cast suppressed (`skip[AM407]`) the script still fails that way; as
    migrated it runs."""
    source = (FIXTURES / "amp" / "no_device.py").read_text(encoding="utf-8")
    line = "curve = fitted.data.numpy()"
    cast, uncast = tmp_path / "cast", tmp_path / "uncast"
    cast.mkdir()
    uncast.mkdir()
    migrated, code = migrate_fixture("no_device.py", cast)
    assert "curve = full_precision(fitted.data).numpy()" in code
    suppressed, suppressed_code = migrate_fixture("no_device.py", uncast, source.replace(line, f"{line}  # accelmigrate: skip[AM407]"))
    assert "full_precision(fitted.data)" not in suppressed_code
    failed = run_python(suppressed, env={**ONE_THREAD, PRECISION_VARIABLE: "bf16"})
    assert failed.returncode != 0 and "Got unsupported ScalarType BFloat16" in failed.stderr
    passed = run_python(migrated, env={**ONE_THREAD, PRECISION_VARIABLE: "bf16"})
    assert passed.returncode == 0, passed.stderr[-3000:]
