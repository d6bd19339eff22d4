"""`--to accelerate` and `--to fabric` write what the libraries' own guides write:
a default `Accelerator()` / `Fabric()` (the script's own mixed precision and
`--no-cuda` flag kept, nothing else), no `.to(device)` for what `prepare`
(`setup`) places, a scheduler stepped per epoch left out of `prepare`, and
the notes that say what differs on N processes; `=parity` writes the
exact-parity form. tests/test_accelerate_verify.py runs both on 2 processes.
"""

from __future__ import annotations

import os

import pytest

from accelmigrate.engine.migrate import migrate_source
from accelmigrate.launch.frameworks import tell_frameworks
from conftest import FIXTURES, PARITY, run_cli

SCRIPT = '''\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    for epoch in range(2):
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
        schedule.step()


if __name__ == "__main__":
    main()
'''


def _migrate(source: str, word: str = "accelerate", options: dict | None = None):
    return migrate_source(source, [(word, options or {})], "train.py")


def _notes(result) -> set[str]:
    return {f.code for f in result.findings if not f.fixed}


def test_the_default_accelerator_is_the_guides():
    result = _migrate(SCRIPT)
    code = result.code
    assert "    accelerator = Accelerator()\n" in code
    assert "from accelerate import Accelerator\n" in code and "DataLoaderConfiguration" not in code
    assert "    model = nn.Linear(4, 1)\n" in code  # prepare places the model
    assert "xb.to(" not in code  # and the batches
    # A scheduler stepped per epoch stays out of prepare, which would step it once per process.
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in code
    assert _notes(result) == {"AM811", "AM834", "AM835", "AM836"}  # AM811: no drop_last


def test_parity_writes_the_exact_form():
    result = _migrate(SCRIPT, options=PARITY)
    code = result.code
    assert "dataloader_config=DataLoaderConfiguration(split_batches=True, dispatch_batches=True)" in code
    assert "accelerator.prepare(model, optimizer, loader, schedule)" in code
    assert not _notes(result) & {"AM834", "AM835", "AM836"}


def test_a_scheduler_stepped_per_batch_is_prepared():
    per_batch = SCRIPT.replace("            optimizer.step()\n", "            optimizer.step()\n            schedule.step()\n").replace("        schedule.step()\n", "")
    result = _migrate(per_batch)
    assert "accelerator.prepare(model, optimizer, loader, schedule)" in result.code
    assert "AM836" not in _notes(result)


@pytest.mark.parametrize(
    "change",
    [
        # the model runs before prepare: it must be on the device then
        ("    optimizer = torch.optim.SGD(", "    model(torch.zeros(1, 4, device=device))\n    optimizer = torch.optim.SGD("),
        # placed on another device than the Accelerator's
        ("model = nn.Linear(4, 1).to(device)", "model = nn.Linear(4, 1).to(torch.device(\"cpu\"))"),
    ],
)
def test_a_model_placement_something_depends_on_stays(change):
    code = _migrate(SCRIPT.replace(*change)).code
    assert ".to(device)" in code or ".to(torch.device" in code
    assert "    model = nn.Linear(4, 1)\n" not in code


def test_a_batch_line_that_does_more_than_place_stays():
    source = SCRIPT.replace("xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)", "xb.to(device).float(), yb.to(device)")
    assert "xb, yb = xb.to(device).float(), yb.to(device)" in _migrate(source).code


def test_the_scripts_own_choices_are_kept():
    code = _migrate((FIXTURES / "accelerate" / "train_fn_mnist_examples.py").read_text()).code
    assert "    accelerator = Accelerator(cpu=args.no_cuda)\n" in code
    code = _migrate((FIXTURES / "accelerate" / "mixed_precision_bf16_flat.py").read_text()).code
    assert 'accelerator = Accelerator(mixed_precision="bf16" if torch.cuda.is_available() else "no")' in code


def test_the_default_fabric_is_the_guides():
    result = _migrate(SCRIPT, "fabric")
    code = result.code
    assert "    fabric = Fabric()\n    fabric.launch()\n" in code
    assert "world_size" not in code and "import os" not in code
    assert "    model = nn.Linear(4, 1)\n" in code and "xb.to(" not in code
    assert "AM934" in _notes(result)
    parity = _migrate(SCRIPT, "fabric", PARITY).code
    assert "devices=int(os.environ.get(\"LOCAL_WORLD_SIZE\", 1))" in parity and "batch_size=16 // fabric.world_size" in parity


@pytest.mark.parametrize("word", ["accelerate", "fabric"])
def test_an_unknown_option_is_a_usage_error(tmp_path, word):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = run_cli("check", str(script), "--to", f"{word}=exact")
    assert done.returncode == 2 and f"use {word}=parity" in done.stderr, done.stderr


def test_the_launch_tells_the_frameworks_what_their_launchers_would():
    environ = {"LT_DEVICES": "3"}  # the user's own setting stays
    tell_frameworks(environ, processes_per_node=2, nodes=1, cuda=False)
    assert environ == {"LT_DEVICES": "3", "LT_NUM_NODES": "1", "ACCELERATE_USE_CPU": "true"}
    on_gpus: dict[str, str] = {}
    tell_frameworks(on_gpus, processes_per_node=4, nodes=2, cuda=True)
    assert on_gpus == {"LT_DEVICES": "4", "LT_NUM_NODES": "2"}
    assert "ACCELERATE_USE_CPU" not in os.environ or os.environ["ACCELERATE_USE_CPU"]


def test_fabric_parity_refuses_a_batch_size_it_cannot_divide():
    """The examples' `DataLoader(ds, **train_kwargs)`: by default set up as it comes; with parity each process must
    load `batch_size // fabric.world_size`, which the dict holds."""
    source = (FIXTURES / "fabric" / "loader_kwargs_dict.py").read_text()
    assert "fabric.setup_dataloaders(" in _migrate(source, "fabric").code
    refused = _migrate(source, "fabric", PARITY)
    assert refused.code == source and "AM929" in _notes(refused)
