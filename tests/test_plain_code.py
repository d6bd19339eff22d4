"""Migrated code the user owns: by default the runtime's helpers are written
into the migrated file as plain definitions (codemods/script/plain_definitions.py,
accelmigrate/engine/plain_inlining.py), so that it runs where accelmigrate is
not installed; `--runtime` (or `runtime = true`) keeps the imports.

- each plain definition answers as the runtime's helper does on a CPU (the
  `no_sync_unless` and `rank_local_buffers` ones on a real one-process gloo
  group; the distributed ones in a world of one and as rank 1 of two, while
  tests/test_ddp.py's launches run the plain code `apply --to ddp` writes on
  two gloo processes and compare it with the one-process run);
- `apply` writes plain code by default and the runtime's imports when asked;
- bundled scripts migrated with `checklist,fast` run in an interpreter that
  cannot import accelmigrate (no site processing: the editable install's
  finder is absent, torch is on PYTHONPATH) and print the same final numbers
  as the same migration with the runtime.
"""

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from accelmigrate.codemods.script import plain_helpers
from accelmigrate.engine.plain_inlining import without_runtime_imports
from accelmigrate.runtime import data, device, distributed, legacy, precision, sharding, speed

from conftest import SCRIPTS, run_cli

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture(scope="module")
def plain():
    spec = importlib.util.spec_from_file_location("plain_definitions", plain_helpers.SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*LAUNCH_VARIABLES, "ACCELMIGRATE_DEVICE", "ACCELMIGRATE_PRECISION", "ACCELMIGRATE_COMPILE", "ACCELMIGRATE_CHANNELS_LAST", "ACCELMIGRATE_FUSED"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_every_plain_definition_stands_for_a_runtime_function():
    for definition in plain_helpers.definitions().values():
        if definition.runtime is not None:
            module, _, name = definition.runtime.rpartition(".")
            assert callable(getattr(importlib.import_module(module), name)), definition.runtime


@pytest.mark.parametrize("launch", [{}, {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}])
def test_workers_device_and_precision_answer_as_the_runtime(plain, clean_env, launch):
    for name, value in launch.items():
        clean_env.setenv(name, value)
    for max_workers in (8, 1, None):
        assert plain.default_num_workers(max_workers) == data.default_num_workers(max_workers)
    assert plain.get_device() == device.get_device() == torch.device("cpu")
    assert plain.device_at(3) == device.device_at(3)
    assert plain.device_ids_for("cpu") is device.device_ids_for("cpu") is None
    assert plain.default_backend() == "gloo"
    for kind in ("cpu", "mps", "xpu"):
        assert plain.autocast_dtype(kind) == precision.autocast_dtype(kind), kind
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert plain.grad_scaler("cpu", dtype).is_enabled() == precision.grad_scaler("cpu", dtype).is_enabled()
    assert not plain.grad_scaler("cpu", torch.float16, enabled=False).is_enabled()


def test_scalers_tensors_and_speed_gates_answer_as_the_runtime(plain, clean_env):
    model = torch.nn.Conv2d(3, 4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = plain.scaler_for(optimizer, "cpu", torch.float16)
    assert scaler is plain.scaler_for(optimizer, "cpu", torch.float16) and scaler.is_enabled()
    assert not plain.scaler_for(None, "cpu", torch.float16).is_enabled()
    # torch.cuda.amp's GradScaler, for a project on a torch before 2.3: scaling on CUDA float16 only
    older = plain.grad_scaler_before_2_3
    assert not older("cpu", torch.float16).is_enabled() and not older("cuda", torch.bfloat16).is_enabled()
    values = [torch.ones(2, dtype=torch.bfloat16), (torch.ones(1, dtype=torch.float16),), torch.ones(1, dtype=torch.int64)]
    for plain_value, runtime_value in zip(plain.full_precision(values), precision.full_precision(values)):
        assert type(plain_value) is type(runtime_value)
    assert plain.full_precision(values)[0].dtype == torch.float32
    assert plain.tensor_type(torch.float32, "cpu") is legacy.tensor_type(torch.float32, "cpu") is torch.FloatTensor
    images = torch.randn(2, 3, 8, 8)
    assert plain.to_channels_last(model) is model and plain.to_channels_last(images) is images
    assert plain.fused_on_cuda(model) is speed.fused_on_cuda(model) is False
    assert plain.should_compile(model) is speed.should_compile(model) is False
    wrapped = torch.nn.DataParallel(model)
    assert plain.unwrap_model(wrapped) is distributed.unwrap_model(wrapped) is model
    assert plain.ddp_device_ids(model) is distributed.ddp_device_ids(model) is None


def test_tf32_is_set_as_the_runtime_sets_it(plain, clean_env):
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    try:
        matmul.fp32_precision = "ieee"
        plain.use_tf32_matmul()
        by_plain = matmul.fp32_precision
        matmul.fp32_precision = "ieee"
        speed.use_tf32_matmul()
        assert by_plain == matmul.fp32_precision == "tf32"
    finally:
        matmul.fp32_precision = before


def test_gradient_sync_and_buffer_keywords_on_a_real_process_group(plain, tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2), **plain.rank_local_buffers())
        assert plain.rank_local_buffers() == distributed.rank_local_buffers()
        with plain.no_sync_unless(False, model):
            assert not model.require_backward_grad_sync
        assert model.require_backward_grad_sync
        with plain.no_sync_unless(True, model):
            assert model.require_backward_grad_sync
        with plain.no_sync_unless(False, torch.nn.Linear(2, 2)):  # a module without gradient sync: nothing to turn off
            pass
    finally:
        dist.destroy_process_group()


def test_distributed_helpers_in_a_world_of_one_answer_as_the_runtime(plain, clean_env):
    assert plain.world_size() == distributed.world_size() == 1
    assert plain.is_main_process() and not plain.is_distributed() and not plain.init_distributed()
    assert plain.per_process_batch_size(8) == 8
    data = torch.utils.data.TensorDataset(torch.arange(10.0))
    for seed in (0, 1):
        torch.manual_seed(seed)
        ours = list(plain.SeededDistributedSampler(data, shuffle=True))
        torch.manual_seed(seed)
        assert ours == list(distributed.SeededDistributedSampler(data, shuffle=True))
    assert list(plain.SeededDistributedSampler(data)) == list(range(10))
    assert plain.rank_zero_decides(1) is True
    assert plain.sum_across_ranks(3) == 3 and plain.average_across_ranks(2.0, 4) == (2.0, 4)
    batch = torch.arange(6)
    assert plain.rank_share(batch) is batch
    kwargs = plain.sharded_loader_kwargs(data, {"batch_size": 4, "shuffle": True})
    assert kwargs["batch_size"] == 4 and isinstance(kwargs["sampler"], plain.SeededDistributedSampler) and "shuffle" not in kwargs
    assert plain.NullWriter().add_scalar("loss", 1.0) is None
    with plain.main_process_first():
        plain.barrier()


def test_sharding_helpers_in_a_world_of_one_answer_as_the_runtime(plain, clean_env, tmp_path):
    """(tests/test_fsdp.py launches the plain code `apply --to fsdp` writes on two gloo processes.)"""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(3, 3)]), torch.nn.Linear(3, 1))
    assert plain.shard_model(model) is model is sharding.shard_model(model)
    assert [id(b) for b in plain._blocks_of(model)] == [id(b) for b in sharding.blocks_of(model)] == [id(model[0][0])]
    state = plain.full_state_dict(torch.compile(model, backend="eager"))
    assert sorted(state) == sorted(sharding.full_state_dict(model)) == sorted(model.state_dict())
    plain.save_full_state_dict(model, tmp_path / "model.pt")
    other = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(3, 3)]), torch.nn.Linear(3, 1))
    plain.load_full_state_dict(other, torch.load(tmp_path / "model.pt"))
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), model.state_dict().values()))


def test_distributed_helpers_of_the_second_of_two_processes_answer_as_the_runtime(plain, clean_env):
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        clean_env.setenv(name, value)
    assert plain.world_size() == distributed.world_size() == 2
    assert not plain.is_main_process() and not distributed.is_main_process()
    assert plain.per_process_batch_size(8) == distributed.per_process_batch_size(8) == 4
    with pytest.raises(ValueError):
        plain.per_process_batch_size(7)
    with pytest.raises(RuntimeError, match="has not joined"):
        plain.is_distributed()
    batch = torch.arange(8).reshape(4, 2)
    assert torch.equal(plain.rank_share(batch), distributed.rank_share(batch))
    assert plain.rank_share(torch.arange(3)).tolist() == distributed.rank_share(torch.arange(3)).tolist() == [0, 1, 2]
    assert plain.rank_share(torch.arange(3), summed=True).tolist() == distributed.rank_share(torch.arange(3), summed=True).tolist()
    torch.manual_seed(0)
    ours = plain.draw_rank_share(torch.randn, 2, 3)
    torch.manual_seed(0)
    assert torch.equal(ours, distributed.draw_rank_share(torch.randn, 2, 3))


def test_a_file_that_reads_torch_through_a_star_import_keeps_its_runtime_imports():
    original = "from utils import *\n\nmodel = torch.nn.Linear(2, 2).cuda()\n"
    migrated = "from accelmigrate.runtime.device import get_device\nfrom utils import *\n\ndevice = get_device()\nmodel = torch.nn.Linear(2, 2).to(device)\n"
    assert without_runtime_imports(original, migrated) == migrated
    own_torch = "import torch\n" + migrated
    assert "def get_device():" in without_runtime_imports("import torch\n" + original, own_torch)


SCRIPT = """import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8)
    model = torch.nn.Linear(4, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("how", ["plain", "--runtime", "runtime = true"])
def test_apply_writes_plain_code_unless_the_runtime_is_asked_for(tmp_path: Path, how: str):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    if how == "runtime = true":
        (tmp_path / "pyproject.toml").write_text("[tool.accelmigrate]\nruntime = true\n")
    applied = run_cli("apply", "--no-cache", "--to", "device,amp", str(script), *(["--runtime"] if how == "--runtime" else []), cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    migrated = script.read_text()
    if how == "plain":
        assert "accelmigrate" not in migrated
        assert "def get_device():" in migrated and "def autocast_dtype(device):" in migrated
        again = run_cli("apply", "--no-cache", "--to", "device,amp", str(script), cwd=tmp_path)
        assert again.returncode == 0 and script.read_text() == migrated, "a second apply changed the plain code"
    else:
        assert "from accelmigrate.runtime.device import get_device" in migrated
        assert "def get_device" not in migrated


def run_without_accelmigrate(script: Path) -> subprocess.CompletedProcess:
    """`python script` where accelmigrate cannot be imported: no site
    processing (so no editable-install finder), torch and numpy on PYTHONPATH."""
    site_packages = str(Path(torch.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": site_packages, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-S", str(script)], capture_output=True, text=True, env=env, cwd=script.parent, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["amp_conv_onecycle", "data_bound", "cuda_only"])
def test_migrated_scripts_run_where_accelmigrate_is_not_installed(tmp_path: Path, name: str):
    finals = {}
    for mode in ("plain", "runtime"):
        folder = tmp_path / mode
        folder.mkdir()
        script = folder / f"{name}.py"
        script.write_text((SCRIPTS / f"{name}.py").read_text())
        applied = run_cli("apply", "--no-cache", "--to", "checklist,fast", str(script), *(["--runtime"] if mode == "runtime" else []), cwd=folder)
        assert applied.returncode == 0, applied.stderr
        if mode == "plain":
            assert "import accelmigrate" not in script.read_text() and "from accelmigrate" not in script.read_text()
            ran = run_without_accelmigrate(script)
        else:
            ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=folder, timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        assert ran.returncode == 0, ran.stderr[-2000:]
        finals[mode] = ran.stdout.strip().splitlines()[-1]
    assert finals["plain"] == finals["runtime"]
