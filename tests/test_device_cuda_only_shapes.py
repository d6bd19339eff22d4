"""Scripts that run only on CUDA, one of each shape that older and
distributed training code takes, migrated with `--to device,amp`: each runs
on a CPU, in fp32 prints exactly what the same script made device-agnostic by
hand prints, and under ACCELMIGRATE_PRECISION=bf16 ends within 3% of its loss.

The shapes: legacy tensor types chosen by CUDA's presence (a GAN), torchrun
with `torch.cuda.set_device(local_rank)` and NCCL, `mp.spawn` workers that
place on their rank's GPU, apex behind `try/except ImportError: raise`, and
GPU ordinals with a checkpoint saved on a GPU.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from accelmigrate.engine.migrate import migrate_source

from conftest import run_launch, run_python
from test_device import _save_as_if_on_gpu

PLAN = [("device", {}), ("amp", {})]
BF16_TOLERANCE = 0.03

GAN = '''
import numpy as np
import torch
import torch.nn as nn
from torch.autograd import Variable

torch.manual_seed(0)
np.random.seed(0)
cuda = True if torch.cuda.is_available() else False

generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
discriminator = nn.Sequential(nn.Linear(4, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
adversarial_loss = nn.BCEWithLogitsLoss()  # on probabilities (nn.BCELoss), amp would refuse it (AM418)
generator.cuda()
discriminator.cuda()
adversarial_loss.cuda()
optimizer_G = torch.optim.Adam(generator.parameters(), lr=2e-4)
optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=2e-4)

Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
LongTensor = torch.cuda.LongTensor if cuda else torch.LongTensor

real_data = torch.randn(64, 4) * 0.5 + 1.0
for i in range(8):
    batch = real_data[(i % 4) * 16:(i % 4 + 1) * 16]
    valid = Variable(Tensor(batch.size(0), 1).fill_(1.0), requires_grad=False)
    fake = Variable(Tensor(batch.size(0), 1).fill_(0.0), requires_grad=False)
    real = Variable(batch.type(torch.cuda.FloatTensor))
    order = LongTensor(np.random.permutation(batch.size(0)))

    optimizer_G.zero_grad()
    z = Variable(Tensor(np.random.normal(0, 1, (batch.shape[0], 8))))
    generated = generator(z) + torch.cuda.FloatTensor([0.01])
    g_loss = adversarial_loss(discriminator(generated), valid)
    g_loss.backward()
    optimizer_G.step()

    optimizer_D.zero_grad()
    real_loss = adversarial_loss(discriminator(real[order]), valid)
    fake_loss = adversarial_loss(discriminator(generated.detach()), fake)
    d_loss = (real_loss + fake_loss) / 2
    d_loss.backward()
    optimizer_D.step()
print("loss: %f" % (d_loss.item() + g_loss.item()))
'''

GAN_BY_HAND = (
    GAN.replace("generator.cuda()\ndiscriminator.cuda()\nadversarial_loss.cuda()\n",
                "device = torch.device('cuda' if cuda else 'cpu')\ngenerator.to(device)\ndiscriminator.to(device)\n")
    .replace("Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor\n", "")
    .replace("LongTensor = torch.cuda.LongTensor if cuda else torch.LongTensor\n", "")
    .replace("Tensor(batch.size(0), 1)", "torch.empty(batch.size(0), 1, device=device)")
    .replace("batch.type(torch.cuda.FloatTensor)", "batch.to(device)")
    .replace("torch.cuda.FloatTensor([0.01])", "torch.tensor([0.01], device=device)")
    .replace("LongTensor(np.random.permutation(batch.size(0)))", "torch.tensor(np.random.permutation(batch.size(0)), device=device)")
    .replace("Tensor(np.random.normal(0, 1, (batch.shape[0], 8)))",
             "torch.tensor(np.random.normal(0, 1, (batch.shape[0], 8)), dtype=torch.float32, device=device)")
)

TORCHRUN = '''
import os

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).cuda()
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(dist.get_rank())
    data, target = torch.randn(64, 8, generator=generator), torch.randn(64, 1, generator=generator)
    for step in range(10):
        x, y = data.cuda(non_blocking=True), target.cuda(non_blocking=True)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if dist.get_rank() == 0:
        print("loss: %f" % loss.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''

TORCHRUN_BY_HAND = (
    TORCHRUN.replace("    torch.cuda.set_device(local_rank)\n", "    if torch.cuda.is_available():\n        torch.cuda.set_device(local_rank)\n")
    .replace('backend="nccl"', 'backend="nccl" if torch.cuda.is_available() else "gloo"')
    .replace("    torch.manual_seed(0)\n", "    torch.manual_seed(0)\n    device = torch.device('cuda', local_rank) if torch.cuda.is_available() else torch.device('cpu')\n")
    .replace(".cuda()", ".to(device)")
    .replace(".cuda(non_blocking=True)", ".to(device, non_blocking=True)")
    .replace("device_ids=[local_rank], output_device=local_rank", "device_ids=[local_rank] if device.type == 'cuda' else None")
)

SPAWN = '''
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def worker(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).cuda(rank)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    data, target = torch.randn(64, 8, generator=generator), torch.randn(64, 1, generator=generator)
    for step in range(10):
        x, y = data.cuda(rank, non_blocking=True), target.cuda(rank, non_blocking=True)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        print("loss: %f" % loss.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    import sys

    mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2)
'''

SPAWN_BY_HAND = (
    SPAWN.replace("    torch.cuda.set_device(rank)\n", "    if torch.cuda.is_available():\n        torch.cuda.set_device(rank)\n")
    .replace('init_process_group("nccl"', 'init_process_group("nccl" if torch.cuda.is_available() else "gloo"')
    .replace("    torch.manual_seed(0)\n", "    torch.manual_seed(0)\n    device = torch.device('cuda', rank) if torch.cuda.is_available() else torch.device('cpu')\n")
    .replace(".cuda(rank)", ".to(device)")
    .replace(".cuda(rank, non_blocking=True)", ".to(device, non_blocking=True)")
    .replace("device_ids=[rank]", "device_ids=[rank] if device.type == 'cuda' else None")
)

APEX = '''
import torch
import torch.nn as nn

try:
    from apex import amp
except ImportError:
    raise ImportError("Please install apex from https://www.github.com/nvidia/apex to run this example.")

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
data, target = torch.randn(64, 8), torch.randn(64, 1)
for step in range(10):
    x, y = data.cuda(), target.cuda()
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
print("loss: %f" % loss.item())
'''

APEX_BY_HAND = (
    APEX.replace('try:\n    from apex import amp\nexcept ImportError:\n    raise ImportError("Please install apex from https://www.github.com/nvidia/apex to run this example.")\n', "")
    .replace('model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n', "")
    .replace("    with amp.scale_loss(loss, optimizer) as scaled_loss:\n        scaled_loss.backward()\n", "    loss.backward()\n")
    .replace("torch.manual_seed(0)\n", "torch.manual_seed(0)\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n")
    .replace(".cuda()", ".to(device)")
)

ORDINALS = '''
import torch
import torch.nn as nn


def fit(model, optimizer, data, target, device):
    for step in range(10):
        x, y = data.to(device), target.to(device)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("loss: %f" % loss.item())


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 1)).to(0)
model[0].load_state_dict(torch.load("gpu.pt"))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(64, 2).to(torch.device(0))
fit(model, optimizer, data, data.sum(1, keepdim=True).to(0), torch.device(0))
'''

ORDINALS_BY_HAND = (
    ORDINALS.replace("torch.manual_seed(0)\n", "torch.manual_seed(0)\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n")
    .replace(".to(0)", ".to(device)")
    .replace("torch.device(0)", "device")
    .replace('torch.load("gpu.pt")', 'torch.load("gpu.pt", map_location=device)')
)

SHAPES = {
    "gan_legacy_tensor_types": (GAN, GAN_BY_HAND, "python"),
    "torchrun_set_device_nccl": (TORCHRUN, TORCHRUN_BY_HAND, "torchrun"),
    "spawn_rank_placements": (SPAWN, SPAWN_BY_HAND, "spawn"),
    "apex_required_at_import": (APEX, APEX_BY_HAND, "python"),
    "ordinals_and_gpu_checkpoint": (ORDINALS, ORDINALS_BY_HAND, "python"),
}


def launch(script: Path, how: str, precision: str = "fp32", port: str = "0") -> subprocess.CompletedProcess:
    env = {"ACCELMIGRATE_PRECISION": precision}
    if how == "torchrun":
        full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", **env}
        command = [sys.executable, "-m", "accelmigrate", "run", str(script), "--nproc-per-node", "2"]
        return run_launch(command, env=full_env, cwd=script.parent, timeout=300)
    args = (port,) if how == "spawn" else ()
    return run_python(script, *args, env=env)


def final_loss(result: subprocess.CompletedProcess) -> float:
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.findall(r"loss: (\S+)", result.stdout)
    assert len(found) == 1, result.stdout
    return float(found[0])


def free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def prepare(tmp_path: Path, name: str, source: str) -> Path:
    if "gpu.pt" in source:
        _save_as_if_on_gpu({"weight": [[0.5, -1.0], [1.5, 0.25]], "bias": [0.1, -0.2]}, tmp_path / "gpu.pt")
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_cuda_only_script_runs_on_a_cpu_after_device_and_amp(tmp_path, name):
    cuda_only, by_hand, how = SHAPES[name]
    migration = migrate_source(cuda_only, PLAN, f"{name}.py")
    unfixed = [f"{f.line} {f.code} {f.message}" for f in migration.findings if not f.fixed]
    assert unfixed == [], unfixed
    original = prepare(tmp_path, "original", cuda_only)
    one_process = {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}
    before = run_python(original, free_port(), env=one_process) if how != "python" else run_python(original)
    assert before.returncode != 0  # CUDA (or apex) is missing here: the script cannot run as written

    migrated = prepare(tmp_path, "migrated", migration.code)
    reference = final_loss(launch(prepare(tmp_path, "by_hand", by_hand), how, port=free_port()))
    assert final_loss(launch(migrated, how, "fp32", port=free_port())) == reference  # printed with 6 decimals
    bf16 = final_loss(launch(migrated, how, "bf16", port=free_port()))
    assert abs(bf16 - reference) <= BF16_TOLERANCE * abs(reference)
