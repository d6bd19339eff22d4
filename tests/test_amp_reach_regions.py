"""amp where the device or the optimizer is found by meaning (issue 20):
string devices (a `--device` flag, `config["device"]`, `self.device`
compared), the device of the model a region calls (`next(model.parameters())
.device`, also in an evaluation function handed the model), a loss summed
in loops, and an optimizer that a caller may leave out (`optimizer=None`).

Each migrated script runs on the CPU: with no setting it prints exactly what
the original printed (autocast and the scaler are off in float32 there);
with ACCELMIGRATE_PRECISION=bf16 autocast changes the numbers and the final
loss stays within 3% of the original's. With fp16 the GradScaler is on: it
runs to the end with a finite loss that autocast moved. (These runs are a
few dozen steps: the scaler skips the first steps while it backs its scale
off from 65536, which moves a short run's trajectory by more than 3%.) The
cases are fixture pairs too (fixtures/amp, fixtures/device); the reach
scripts are benchmarks/reach/."""

import math
import textwrap
from pathlib import Path

import pytest

from accelmigrate.engine.migrate import migrate_source
from accelmigrate.runtime.precision import PRECISION_VARIABLE

from conftest import FIXTURES, ROOT, run_python
from test_amp import ONE_THREAD, final_loss
from test_fixture_pairs import plan_for

REACH = ROOT / "benchmarks" / "reach"

CASES = [
    FIXTURES / "amp" / "string_device_flag.py",
    FIXTURES / "amp" / "string_device_passed.py",
    FIXTURES / "amp" / "config_dict_device.py",
    FIXTURES / "amp" / "model_device_from_config.py",
    FIXTURES / "amp" / "evaluate_model_parameter.py",
    FIXTURES / "amp" / "loss_summed_in_loop.py",
    FIXTURES / "amp" / "loss_loop_own_continue.py",
    FIXTURES / "amp" / "optimizer_optional_parameter.py",
]
# Reach scripts that the original runs on a CPU, migrated with the words amp needs.
REACH_SCRIPTS = [
    "tiny_gpt_config.py",
    "string_device_flags.py",
    "trainer_factory_scheduler.py",
    "early_stopping_val.py",
    "seq2seq_two_optimizers.py",
]


def migrate(case: Path, tmp_path: Path, plan=None):
    source = case.read_text(encoding="utf-8")
    migration = migrate_source(source, plan or plan_for(case, source), str(case))
    script = tmp_path / case.name
    script.write_text(migration.code, encoding="utf-8")
    return script, migration


def assert_trains_as_before(original, script: Path) -> None:
    assert original.returncode == 0, original.stderr[-3000:]
    default = run_python(script, env={**ONE_THREAD, PRECISION_VARIABLE: ""})
    assert default.returncode == 0, default.stderr[-3000:]
    assert default.stdout == original.stdout
    expected = final_loss(original)
    bf16 = final_loss(run_python(script, env={**ONE_THREAD, PRECISION_VARIABLE: "bf16"}))
    assert bf16 != expected, "bf16: autocast changed nothing"
    assert bf16 == pytest.approx(expected, rel=0.03)
    fp16 = final_loss(run_python(script, env={**ONE_THREAD, PRECISION_VARIABLE: "fp16"}))
    assert math.isfinite(fp16) and fp16 != expected


def codes(source: str, words: str = "device,amp") -> list:
    plan = [(word, {}) for word in words.split(",")]
    return [f.code for f in migrate_source(textwrap.dedent(source), plan).findings if f.code.startswith("AM4")]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.stem)
def test_the_migrated_case_trains_as_before(case, tmp_path):
    original = run_python(case, env=ONE_THREAD, cwd=tmp_path)
    script, migration = migrate(case, tmp_path)
    assert "AM401" in {f.code for f in migration.findings if f.fixed}, migration.findings
    assert_trains_as_before(original, script)


@pytest.mark.slow
@pytest.mark.parametrize("name", REACH_SCRIPTS)
def test_the_migrated_reach_script_trains_as_before(name, tmp_path):
    case = REACH / name
    original = run_python(case, env=ONE_THREAD, cwd=tmp_path)
    script, migration = migrate(case, tmp_path, [("device", {}), ("amp", {})])
    assert not [f for f in migration.findings if not f.fixed and f.code.startswith("AM4")], migration.findings
    assert_trains_as_before(original, script)


def test_a_string_device_is_read_through_torch_device():
    migrated = migrate_source((FIXTURES / "amp" / "string_device_flag.py").read_text(), [("device", {}), ("amp", {})]).code
    assert "device_type=torch.device(device).type" in migrated
    assert 'if device == "cuda":' in migrated  # the user's string is kept where it is compared


def test_a_config_dict_that_changes_is_no_device():
    source = """
    import torch
    config = {"device": "cuda" if torch.cuda.is_available() else "cpu"}
    config["device"] = "cpu"
    model = torch.nn.Linear(3, 1)
    model = model.to(config["device"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        loss = model(torch.randn(2, 3).to(config["device"])).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
    assert codes(source) == ["AM413"]


def test_two_models_called_in_a_step_give_no_model_device():
    source = """
    import torch
    from types import SimpleNamespace
    opts = SimpleNamespace(device="cpu")
    encoder = torch.nn.Linear(3, 4).to(opts.device)
    decoder = torch.nn.Linear(4, 1).to(opts.device)
    optimizer = torch.optim.SGD([*encoder.parameters(), *decoder.parameters()], lr=0.1)
    for _ in range(2):
        loss = decoder(encoder(torch.randn(2, 3).to(opts.device))).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
    assert codes(source) == ["AM413"]


def test_a_loop_that_steps_stays_out_of_the_region():
    """The loss bound by a loop that also steps (an inner optimisation) is
    no forward pass: AM410, as before."""
    source = """
    import torch
    device = torch.device("cpu")
    model = torch.nn.Linear(3, 1).to(device)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        for k in range(2):
            loss = model(torch.randn(2, 3, device=device)).sum()
            inner.step()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
    assert "AM410" in codes(source, "amp")


def test_gradients_applied_by_hand_say_so():
    source = """
    import torch
    device = torch.device("cpu")
    model = torch.nn.Linear(3, 1).to(device)
    for _ in range(2):
        loss = model(torch.randn(2, 3, device=device)).sum()
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
    """
    migration = migrate_source(textwrap.dedent(source), [("amp", {})])
    refused = [f for f in migration.findings if f.code == "AM410"]
    assert refused and "applied by hand" in refused[0].message
