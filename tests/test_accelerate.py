"""The accelerate codemod (codemods/accelerate.py).

- fast: the codemod never imports torch or accelerate; `explain accelerate`;
  what a migrated script writes for the Accelerator (the batch setting that
  accelerate 1.x honours); refusals leave the file as it was;
- end to end (slow): bundled one-process scripts (fixtures/scripts/dp_parity.py,
  a DataParallel script in main(); ddp_plain_flat.py, a flat script) migrated
  with `--to accelerate` run as plain `python` and on 2 CPU processes under
  torchrun (gloo, ACCELERATE_USE_CPU=true): each prints its epoch lines once,
  writes one checkpoint whose keys carry no `module.`, and ends with the
  one-process original's weights within 1e-5. A shuffled, seeded run keeps
  the original's order: in a world of one, and on 2 processes, where rank 0
  draws it and sends each rank its half of every batch (dispatch_batches):
  the ranks' halves, batch by batch, are the original's batches, and the
  weights are the original's within 1e-5;
- mixed precision (slow): a CUDA fp16 script with a GradScaler (unscale_
  before clipping), migrated onto `Accelerator(mixed_precision=...)`, run
  on a CPU, where the original's CUDA autocast and scaler were off and the
  migrated script asks for "no": every step's loss is the original's
  within 1e-6.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PARITY, ROOT, SCRIPTS, run_cli
from launching import Launch, cpu_env, on_two

from accelmigrate.engine.migrate import migrate_source

TOLERANCE = 1e-5
TRAIN_SAMPLES = 256  # dp_parity.py's training set
BATCH_SIZE = 16  # dp_parity.py's default global batch
EPOCHS = 3


def _migrate(source: str) -> object:
    return migrate_source(source, [("accelerate", PARITY)], "train.py")


def test_codemod_does_not_import_torch_or_accelerate():
    code = "import sys, codemods.accelerate; print('torch' in sys.modules, 'accelerate' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_explain_prints_the_codemods_documentation():
    done = run_cli("explain", "accelerate")
    assert done.returncode == 0, done.stderr
    assert "split_batches=True" in done.stdout and "AM821" in done.stdout


def test_the_global_batch_setting_is_the_one_accelerate_reads():
    # Accelerate 1.x accepts Accelerator(split_batches=True) and ignores it:
    # the migrated script must say it through the DataLoaderConfiguration.
    migrated = _migrate((SCRIPTS / "dp_parity.py").read_text()).code
    assert "dataloader_config=DataLoaderConfiguration(split_batches=True" in migrated
    assert "Accelerator(split_batches" not in migrated
    assert "accelmigrate" not in migrated.replace("# accelmigrate: skip", "")


@pytest.mark.parametrize("script, code", [("ddp_early_exit.py", "AM830"), ("amp_old_api.py", "AM821")])
def test_what_cannot_be_made_right_is_refused_whole(script, code):
    source = (SCRIPTS / script).read_text()
    result = _migrate(source)
    assert result.code == source
    assert [f.code for f in result.findings if not f.fixed] == [code]


MIXED_PRECISION = '''\
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(96, 8)
    y = x[:, :3].sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, drop_last=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.cuda.amp.GradScaler()
    for epoch in range(3):
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(xb), yb)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            scaler.step(optimizer)
            scaler.update()
            print(f"step loss {loss.item()!r}")


if __name__ == "__main__":
    main()
'''


def test_mixed_precision_moves_onto_the_accelerator():
    migrated = _migrate(MIXED_PRECISION).code
    assert 'Accelerator(mixed_precision="fp16" if torch.cuda.is_available() else "no", ' in migrated
    assert "scaler" not in migrated and "autocast" not in migrated
    assert "accelerator.backward(loss)" in migrated and "optimizer.step()" in migrated


@pytest.mark.slow
def test_mixed_precision_script_on_a_cpu_computes_the_originals_losses(tmp_path):
    original, migrated = tmp_path / "original.py", tmp_path / "migrated.py"
    original.write_text(MIXED_PRECISION)
    migrated.write_text(_migrate(MIXED_PRECISION).code)
    losses = []
    for script in (original, migrated):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=cpu_env(), cwd=tmp_path, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        losses.append([float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step loss")])
    assert len(losses[0]) == 18
    assert max(abs(a - b) for a, b in zip(*losses)) <= 1e-6 and len(losses[0]) == len(losses[1])


# -- end to end ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("accelerate")
    migrated = {}
    for script in ("dp_parity.py", "ddp_plain_flat.py"):
        result = _migrate((SCRIPTS / script).read_text())
        assert "accelerator.prepare(" in result.code, [str(f) for f in result.findings]
        migrated[script] = work / f"accelerate_{script}"
        migrated[script].write_text(result.code)
    folders = {}
    for name in ("original", "plain", "two", "flat_original", "flat_plain", "flat_two",
                 "shuffled_original", "shuffled_plain", "shuffled_two"):
        folders[name] = work / name
        folders[name].mkdir()
    dp, flat = migrated["dp_parity.py"], migrated["ddp_plain_flat.py"]
    cpu = cpu_env(ACCELERATE_USE_CPU="true")

    def parity(folder: str, shuffled: bool = False) -> list[str]:
        extra = ["--shuffle", "--trace", str(folders[folder])] if shuffled else []
        return ["--out", str(folders[folder]), "--epochs", str(EPOCHS), *extra]

    launches = {
        "original": [sys.executable, str(SCRIPTS / "dp_parity.py"), *parity("original")],
        "plain": [sys.executable, str(dp), *parity("plain")],
        "two": on_two(dp, *parity("two")),
        "flat_original": [sys.executable, str(SCRIPTS / "ddp_plain_flat.py"), str(folders["flat_original"])],
        "flat_plain": [sys.executable, str(flat), str(folders["flat_plain"])],
        "flat_two": on_two(flat, str(folders["flat_two"])),
        "shuffled_original": [sys.executable, str(SCRIPTS / "dp_parity.py"), *parity("shuffled_original", True)],
        "shuffled_plain": [sys.executable, str(dp), *parity("shuffled_plain", True)],
        "shuffled_two": on_two(dp, *parity("shuffled_two", True)),
    }
    started = [Launch(work, name, command, cpu, work, outputs=folders[name]) for name, command in launches.items()]
    return {launch.name: launch.wait().succeeded() for launch in started}, folders


def _checkpoints(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == ".pt")


def _weights(folder: Path) -> dict:
    import torch

    (checkpoint,) = _checkpoints(folder)
    return torch.load(checkpoint)


def _largest_difference(original: dict, migrated: dict) -> float:
    # The DataParallel original saves `module.` keys; the migrated script must not.
    original = {key.removeprefix("module."): value for key, value in original.items()}
    assert set(original) == set(migrated)
    return max((original[key] - migrated[key]).abs().max().item() for key in original)


def _epoch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("epoch")]


@pytest.mark.slow
@pytest.mark.parametrize("original, migrated", [("original", "plain"), ("original", "two"), ("flat_original", "flat_plain"), ("flat_original", "flat_two")])
def test_migrated_script_ends_with_the_originals_weights(runs, original, migrated):
    _, folders = runs
    assert len(_checkpoints(folders[migrated])) == 1, "one checkpoint, written by the main process"
    weights = _weights(folders[migrated])
    assert not any(key.startswith("module.") for key in weights)
    assert _largest_difference(_weights(folders[original]), weights) <= TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("migrated", ["plain", "two"])
def test_epoch_lines_are_printed_once_with_the_originals_accuracy(runs, migrated):
    launches, _ = runs
    expected = _epoch_lines(launches["original"].stdout)
    assert len(expected) == EPOCHS
    assert _epoch_lines(launches[migrated].stdout) == expected


def _traces(folder: Path) -> list[list[list[int]]]:
    """Per writer, per epoch, the sample indices trained on."""
    return [[[int(i) for i in line.split()] for line in p.read_text().splitlines()] for p in sorted(folder.glob("seen-*.txt"))]


@pytest.mark.slow
def test_shuffled_world_of_one_trains_in_the_originals_order(runs):
    _, folders = runs
    assert _traces(folders["shuffled_plain"]) == _traces(folders["shuffled_original"])
    assert _largest_difference(_weights(folders["shuffled_original"]), _weights(folders["shuffled_plain"])) <= TOLERANCE


def test_a_shuffled_loader_is_dispatched_from_the_main_process():
    migrated = _migrate((SCRIPTS / "dp_parity.py").read_text())  # shuffle=args.shuffle
    assert "DataLoaderConfiguration(split_batches=True, dispatch_batches=True)" in migrated.code
    assert "AM810" in [f.code for f in migrated.findings if f.fixed]
    flat = _migrate((SCRIPTS / "ddp_plain_flat.py").read_text()).code  # unshuffled: every process reads it
    assert "DataLoaderConfiguration(split_batches=True))" in flat


@pytest.mark.slow
def test_shuffled_two_processes_train_in_the_originals_order(runs):
    # Rank 0 draws the original's permutation and sends each rank its half
    # of every global batch (dispatch_batches=True, finding AM810): rank 0's
    # half then rank 1's is the original's batch, every step.
    _, folders = runs
    (original,) = _traces(folders["shuffled_original"])
    ranks = _traces(folders["shuffled_two"])  # by process id: rank 0 need not come first
    assert [len(epochs) for epochs in ranks] == [EPOCHS, EPOCHS] and len(original) == EPOCHS
    half = BATCH_SIZE // 2

    def joined(lower, upper) -> list[list[int]]:
        return [[i for step in range(0, len(mine), half) for i in mine[step:step + half] + theirs[step:step + half]]
                for mine, theirs in zip(lower, upper)]

    assert original in (joined(*ranks), joined(*reversed(ranks)))
    assert original[0] != original[1]
    assert _largest_difference(_weights(folders["shuffled_original"]), _weights(folders["shuffled_two"])) <= TOLERANCE
