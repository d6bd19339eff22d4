"""Device placements of real-script shapes that used to be refused or left
inline: a string device handed to a training function, a flat script's
`.cuda(args.gpu)`, and DistributedDataParallel of a module moved in the call.
Each migrated fixture runs on a CPU and computes what the original computes
with CUDA emulated by the CPU."""

import re

import pytest
import torch

from accelmigrate.engine.migrate import migrate_source
from accelmigrate.runtime.device import device_ids_for

from conftest import FIXTURES, ON_EMULATED_CUDA, run_cli, run_python

DEVICE = FIXTURES / "device"


def test_device_ids_follow_the_device_the_module_was_moved_to():
    assert device_ids_for(torch.device("cpu")) is None  # DDP refuses GPU ids for a CPU module
    assert device_ids_for("cpu") is None
    assert device_ids_for(torch.device("cuda", 3)) == [3]


@pytest.mark.parametrize("case", ["string_device_passed_to_trainer", "gpu_flag_flat"])
def test_migrated_fixture_runs_on_a_cpu_as_the_original_would(tmp_path, case):
    migrated, original = DEVICE / f"{case}.expected.py", DEVICE / f"{case}.py"
    after = run_python(migrated, cwd=tmp_path, env={"ACCELMIGRATE_DEVICE": "cpu"})
    before = run_python(ON_EMULATED_CUDA, str(original), cwd=tmp_path)
    assert after.returncode == 0 and before.returncode == 0, after.stderr + before.stderr
    assert after.stdout and after.stdout == before.stdout  # the same losses, to the last printed digit


def test_ddp_of_a_module_moved_in_the_call_runs_on_two_cpu_processes(tmp_path):
    script = tmp_path / "train.py"
    script.write_text((DEVICE / "ddp_wraps_placed_model.expected.py").read_text())
    launched = run_cli("run", "--nproc-per-node", "2", str(script), cwd=tmp_path, env={"CUDA_VISIBLE_DEVICES": ""})
    assert launched.returncode == 0, launched.stderr + launched.stdout
    # Both ranks print to one pipe, where one line may run into the other.
    weights = re.findall(r"rank (\d) weights: (-?\d+\.\d{6})", launched.stdout)
    assert sorted(rank for rank, _ in weights) == ["0", "1"]
    assert len({value for _, value in weights}) == 1  # DDP kept the two ranks' weights equal


# -- where one binding would change the meaning, the placements stay as they were ------

FLAT_GPU_FLAG = '''import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--gpu", type=int, default=0)
args = parser.parse_args()
{between}
model = torch.nn.Linear(2, 2).cuda(args.gpu)
x = torch.randn(2, 2).cuda(args.gpu)
'''


def migrated(source: str):
    return migrate_source(source, [("device", {})], "train.py")


def test_a_flat_scripts_gpu_flag_is_bound_once_after_it_is_read():
    code = migrated(FLAT_GPU_FLAG.format(between="")).code
    assert "args = parser.parse_args()\ndevice = device_at(args.gpu)\n" in code
    assert code.count("device_at(") == 1 and ".to(device)" in code


@pytest.mark.parametrize(
    "between",
    [
        "args.gpu = args.gpu + 1  # the index changes after it is read",
        "x = torch.zeros(1).cuda(args.gpu)\nargs = parser.parse_args([])  # rebound",
    ],
)
def test_an_index_that_may_change_keeps_device_at_at_each_placement(between):
    code = migrated(FLAT_GPU_FLAG.format(between=between)).code
    assert "device = device_at" not in code
    assert "model = torch.nn.Linear(2, 2).to(device_at(args.gpu))" in code


def test_a_string_device_that_the_called_function_compares_is_still_reported():
    source = '''import torch


def train(model, device):
    if device == "cuda":
        torch.backends.cudnn.benchmark = True
    model.to(device)


if __name__ == "__main__":
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train(torch.nn.Linear(2, 2), device)
'''
    result = migrated(source)
    assert result.code == source
    assert [(f.code, f.fixed) for f in result.findings] == [("AM303", False)]
