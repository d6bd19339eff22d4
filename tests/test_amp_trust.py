"""`--to amp` keeps scripts that ran running (issue 18, items 2, 3 and 7):
each case below ran before the migration and failed after it (an
UnboundLocalError, a NameError on some path, a training step refused for a
gym environment's `envs.step(actions)`), or autocast was keyed to a device
the computation is not on. Migrated, each runs; on a CPU with no setting it
prints exactly what the original printed (float32), and in bf16 (and fp16,
with the scaler on) its final loss stays within 3% of the original's.
The cases are fixture pairs too (fixtures/amp)."""

import json
import shutil
from pathlib import Path

import pytest

from accelmigrate.engine.migrate import migrate_source
from accelmigrate.runtime.precision import PRECISION_VARIABLE

from conftest import FIXTURES, run_cli, run_python
from test_amp import ONE_THREAD, final_loss

CASES = FIXTURES / "amp"

# Stand-ins for the third-party packages the DQN imports: a vector
# environment of one-step bandits, and a scheduler factory.
STUBS = {
    "gym/__init__.py": "from . import vector\n",
    "gym/vector/__init__.py": '''
import torch


class SyncVectorEnv:
    num_actions = 2

    def __init__(self, fns):
        self.num_envs = len(fns)
        self.generator = torch.Generator().manual_seed(1)

    def reset(self, seed=None):
        return torch.rand(self.num_envs, 4, generator=self.generator), {}

    def step(self, actions):
        obs = torch.rand(self.num_envs, 4, generator=self.generator)
        rewards = (torch.as_tensor(actions) == 1).float() + obs[:, 0]
        done = torch.zeros(self.num_envs, dtype=torch.bool)
        return obs, rewards, done, done, {}
''',
    "transformers/__init__.py": '''
import torch


def get_linear_schedule_with_warmup(optimizer, warmup, total):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) * max(0.0, 1 - step / total))
''',
}


def with_stubs(tmp_path: Path) -> dict:
    for name, text in STUBS.items():
        path = tmp_path / "stubs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return {**ONE_THREAD, "PYTHONPATH": str(tmp_path / "stubs")}


def migrated(name: str, tmp_path: Path) -> tuple[Path, object]:
    case = CASES / name
    migration = migrate_source(case.read_text(encoding="utf-8"), [("amp", {})], str(case))
    path = tmp_path / name
    path.write_text(migration.code, encoding="utf-8")
    return path, migration


def assert_trains_as_before(original, script: Path, *args: str, env: dict) -> None:
    """Float32 by default: the original's output exactly. bf16 and fp16:
    autocast runs (the loss moves) and the loss stays within 3%."""
    assert original.returncode == 0, original.stderr[-3000:]
    default = run_python(script, *args, env={**env, PRECISION_VARIABLE: ""})
    assert default.returncode == 0, default.stderr[-3000:]
    assert default.stdout == original.stdout
    for precision in ("bf16", "fp16"):
        loss = final_loss(run_python(script, *args, env={**env, PRECISION_VARIABLE: precision}))
        assert loss != final_loss(original), f"{precision}: autocast changed nothing"
        assert loss == pytest.approx(final_loss(original), rel=0.03)


RUNS = [
    pytest.param("local_grad_scaler.py", (), id="local-grad_scaler"),
    pytest.param("cpu_names_taken.py", (), id="own-amp_dtype"),
    pytest.param("optimizer_under_flag.py", (), id="no-optimizer"),
    pytest.param("optimizer_under_flag.py", ("--use-optimizer",), id="optimizer"),
    pytest.param("notebook_two_models.py", (), id="two-models"),
    pytest.param("vector_env_step.py", (), id="vector-env"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, args", RUNS)
def test_the_migrated_script_runs_and_trains_as_before(name, args, tmp_path):
    env = with_stubs(tmp_path)
    original = run_python(CASES / name, *args, env=env, cwd=tmp_path)
    script, migration = migrated(name, tmp_path)
    assert {"AM401", "AM404"} & {f.code for f in migration.findings if f.fixed}, migration.findings
    assert_trains_as_before(original, script, *args, env=env)


def test_names_the_script_binds_are_not_reused():
    """`grad_scaler = torch.cuda.amp.GradScaler()` in a function: the runtime's
    grad_scaler is imported under an alias; `amp_dtype` bound in a function
    that the module's dtype is read in: the dtype takes another name."""
    code = migrate_source((CASES / "local_grad_scaler.py").read_text(encoding="utf-8"), [("amp", {})]).code
    assert "grad_scaler as accelmigrate_grad_scaler" in code
    assert "grad_scaler = accelmigrate_grad_scaler(device, amp_dtype, enabled=amp)" in code
    code = migrate_source((CASES / "cpu_names_taken.py").read_text(encoding="utf-8"), [("amp", {})]).code
    assert 'autocast_dtype_ = autocast_dtype("cpu")' in code and "dtype=amp_dtype" not in code


def test_gradients_read_where_no_optimizer_steps_keep_the_step_in_float32():
    """A hand-written update in the `else:` of the optimizer's step reads the
    gradients: in float16 they would carry the loss scale. The step is
    refused (AM415) and the script left as it ran."""
    source = (CASES / "hand_written_update_branch.py").read_text(encoding="utf-8")
    migration = migrate_source(source, [("amp", {})])
    assert migration.code == source
    assert [f.code for f in migration.findings] == ["AM415"]


def test_untraced_receivers_of_step_are_no_optimizers_unless_used_as_one():
    """`envs.step(actions)` and a factory's scheduler do not block the step;
    a factory's object that the script zeroes is still taken for an optimizer."""
    source = (CASES / "vector_env_step.py").read_text(encoding="utf-8")
    assert "AM401" in {f.code for f in migrate_source(source, [("amp", {})]).findings if f.fixed}
    zeroed = source.replace("        obs = next_obs\n", "        obs = next_obs\n        envs.zero_grad()\n")
    assert "AM414" in {f.code for f in migrate_source(zeroed, [("amp", {})]).findings}


# -- a notebook that trains two models (item 3) -------------------------------------


def notebook_cells() -> list[str]:
    """notebook_two_models.py cut into cells at its blank-line pairs."""
    source = (CASES / "notebook_two_models.py").read_text(encoding="utf-8")
    return [cell.strip("\n") + "\n" for cell in source.split("\n\n\n")]


def write_notebook(path: Path, cells: list[str]) -> None:
    notebook = {
        "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": cell} for cell in cells],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(notebook, indent=1), encoding="utf-8")


@pytest.mark.slow
def test_a_notebook_that_trains_two_models_runs_once_migrated(tmp_path):
    """The training function is defined in an early cell and first runs with
    the first optimizer: the scaler is bound in the first optimizer's cell,
    before that run, not beside the second optimizer in a later cell."""
    cells = notebook_cells()
    notebook = tmp_path / "two_models.ipynb"
    write_notebook(notebook, cells)
    applied = run_cli("apply", "--no-cache", "--to", "amp", "--runtime", str(notebook), cwd=tmp_path)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    migrated_cells = ["".join(c["source"]) for c in json.loads(notebook.read_text(encoding="utf-8"))["cells"]]
    first_optimizer = next(i for i, cell in enumerate(migrated_cells) if "optim.SGD" in cell)
    assert "scaler = grad_scaler(device, amp_dtype)" in migrated_cells[first_optimizer]
    original, script = tmp_path / "original.py", tmp_path / "migrated.py"
    original.write_text("\n".join(cells), encoding="utf-8")
    script.write_text("\n".join(migrated_cells), encoding="utf-8")
    assert_trains_as_before(run_python(original, env=ONE_THREAD), script, env=ONE_THREAD)


# -- autocast follows the device the computation is on (item 2) ---------------------


@pytest.mark.slow
def test_checklist_keys_autocast_to_the_cpu_where_the_tutorial_computes(tmp_path):
    """The CIFAR-10 tutorial shape binds and prints a CUDA device but keeps
    the network and its batches on the CPU: `--to checklist` keys autocast
    and the scaler to the CPU, the AM401 finding says so, and the script
    trains as before."""
    script = tmp_path / "device_never_used.py"
    shutil.copy(CASES / "device_never_used.py", script)
    applied = run_cli("apply", "--no-cache", "--to", "checklist", "--show-fixes", "--runtime", str(script), cwd=tmp_path)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "moves nothing to it" in applied.stdout
    code = script.read_text(encoding="utf-8")
    assert 'device_type="cpu"' in code and 'grad_scaler("cpu", amp_dtype)' in code
    assert "device.type" not in code
    original = run_python(CASES / "device_never_used.py", env=ONE_THREAD, cwd=tmp_path)
    assert_trains_as_before(original, script, env=ONE_THREAD)


def test_a_device_the_model_is_moved_to_keeps_autocast_on_it():
    """The same script with `net = Net().to(device)`: autocast on device.type."""
    source = (CASES / "device_never_used.py").read_text(encoding="utf-8").replace("net = Net()", "net = Net().to(device)")
    code = migrate_source(source, [("amp", {})]).code
    assert "device_type=device.type" in code and 'device_type="cpu"' not in code


DEFAULT_STRING_DEVICE = '''\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, loader, device="cpu"):
        self.model = model.to(device)
        self.loader = loader
        self.device = device
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train_epoch(self):
        for x, y in self.loader:
            x, y = x.to(self.device), y.to(self.device)
            loss = nn.functional.mse_loss(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    @torch.no_grad()
    def sample(self):
        return self.model(torch.randn(4, 4, device=self.device))


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
    trainer = Trainer(nn.Linear(4, 1), loader, device=device)
    trainer.train_epoch()


if __name__ == "__main__":
    main()
'''


def test_a_constructors_string_default_device_is_read_as_a_device(tmp_path):
    """The file's own call passes a torch.device, but a call from elsewhere
    that leaves `device` out passes the string default: autocast reads its
    type through `torch.device(...)`, in training and in sampling alike."""
    migrated = migrate_source(DEFAULT_STRING_DEVICE, [("amp", {})], "trainer.py").code
    assert "self.device.type" not in migrated and migrated.count("device_type=torch.device(self.device).type") == 2
    (tmp_path / "trainer.py").write_text(migrated)
    (tmp_path / "elsewhere.py").write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom trainer import Trainer\n\n"
        "trainer = Trainer(nn.Linear(4, 1), DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4))\n"
        "trainer.train_epoch()\nprint(tuple(trainer.sample().shape))\n"
    )
    ran = run_python(tmp_path / "elsewhere.py", cwd=tmp_path, env={PRECISION_VARIABLE: "bf16"})
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == "(4, 1)"
