"""The fabric codemod (codemods/fabric.py).

- fast: the codemod never imports torch or lightning_fabric; `explain
  fabric`; the Fabric the migrated script makes (the settings that run it
  under plain `python` and under torchrun, with no variable to set), the
  global batch shared out, the refusals (the file unchanged), a shuffled
  loader noted, a suppression given with fabric's own code;
- end to end (slow): bundled one-process scripts (fixtures/scripts/dp_parity.py,
  a DataParallel script in main() with argparse; ddp_plain_flat.py, a flat
  script) migrated with `--to fabric` run as plain `python` and on 2 CPU
  processes under torchrun (gloo): each prints its epoch lines once (the
  original's), writes one checkpoint whose keys carry no `module.`, and ends
  with the unshuffled one-process original's weights within 1e-5. A
  shuffled, seeded run keeps the original's order in a world of one
  (Fabric's DistributedSampler draws another on 2 processes: AM910).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PARITY, ROOT, SCRIPTS, run_cli
from launching import ONE_PROCESS_TOLERANCE, cpu_env, launch_all, on_two

from accelmigrate.engine.migrate import migrate_source

EPOCHS = 3


def _migrate(source: str) -> object:
    return migrate_source(source, [("fabric", PARITY)], "train.py")


def test_codemod_does_not_import_torch_or_lightning():
    code = "import sys, codemods.fabric; print('torch' in sys.modules, 'lightning_fabric' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_explain_prints_the_codemods_documentation():
    done = run_cli("explain", "fabric")
    assert done.returncode == 0, done.stderr
    assert "fabric.setup_dataloaders" in done.stdout and "LOCAL_WORLD_SIZE" in done.stdout and "AM921" in done.stdout


def test_the_fabric_runs_as_plain_python_and_under_torchrun():
    migrated = _migrate((SCRIPTS / "dp_parity.py").read_text()).code
    # devices * num_nodes must be torchrun's WORLD_SIZE (TorchElasticEnvironment.validate_settings);
    # without torchrun both variables are unset: one device, one node.
    assert 'devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1))' in migrated
    assert 'num_nodes=int(os.environ.get("WORLD_SIZE", 1)) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))' in migrated
    assert "    fabric.launch()\n" in migrated
    assert "model, optimizer = fabric.setup(model, optimizer)" in migrated
    assert "train_loader = fabric.setup_dataloaders(train_loader)" in migrated
    # The DistributedSampler shares the data set out: each process loads its share of the global batch.
    assert "batch_size=args.batch_size // fabric.world_size" in migrated
    assert "torch.save(model.state_dict()" in migrated and "if fabric.is_global_zero:" in migrated
    assert "accelerat" not in migrated.replace('accelerator="cuda"', "") and "accelmigrate" not in migrated.replace("# accelmigrate: skip", "")


def test_a_shuffled_loader_is_noted_not_fixed():
    findings = _migrate((SCRIPTS / "dp_parity.py").read_text()).findings  # shuffle=args.shuffle
    assert [f.fixed for f in findings if f.code == "AM910"] == [False]
    flat = _migrate((SCRIPTS / "ddp_plain_flat.py").read_text()).findings  # unshuffled
    assert "AM910" not in [f.code for f in flat]


@pytest.mark.parametrize("script, code", [("ddp_early_exit.py", "AM930"), ("amp_old_api.py", "AM921")])
def test_what_cannot_be_made_right_is_refused_whole(script, code):
    source = (SCRIPTS / script).read_text()
    result = _migrate(source)
    assert result.code == source
    assert [f.code for f in result.findings if not f.fixed] == [code]


def test_a_suppression_takes_fabrics_code():
    source = (SCRIPTS / "ddp_plain_flat.py").read_text()
    save = 'torch.save(model.state_dict(), os.path.join(OUT, "plain.pt"))'
    migrated = _migrate(source.replace(save, save + "  # accelmigrate: skip[AM908]")).code
    assert "is_global_zero" not in migrated and "fabric.backward(loss)" in migrated


# -- end to end ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("fabric")
    migrated = {}
    for script in ("dp_parity.py", "ddp_plain_flat.py"):
        result = _migrate((SCRIPTS / script).read_text())
        assert "fabric.setup(" in result.code, [str(f) for f in result.findings]
        migrated[script] = work / f"fabric_{script}"
        migrated[script].write_text(result.code)
    dp, flat = migrated["dp_parity.py"], migrated["ddp_plain_flat.py"]
    parity = ["--out", "{folder}", "--epochs", str(EPOCHS)]
    shuffled = [*parity, "--shuffle", "--trace", "{folder}"]
    plans = {
        "original": [sys.executable, str(SCRIPTS / "dp_parity.py"), *parity],
        "plain": [sys.executable, str(dp), *parity],
        "two": on_two(dp, *parity),
        "flat_original": [sys.executable, str(SCRIPTS / "ddp_plain_flat.py"), "{folder}"],
        "flat_plain": [sys.executable, str(flat), "{folder}"],
        "flat_two": on_two(flat, "{folder}"),
        "shuffled_original": [sys.executable, str(SCRIPTS / "dp_parity.py"), *shuffled],
        "shuffled_plain": [sys.executable, str(dp), *shuffled],
    }
    launches, folders = launch_all(work, plans, cpu_env())
    return {name: launch.succeeded() for name, launch in launches.items()}, folders


def _weights(folder: Path) -> dict:
    import torch

    checkpoints = sorted(folder.glob("*.pt"))
    assert len(checkpoints) == 1, "one checkpoint, written by the main process"
    return torch.load(checkpoints[0])


def _largest_difference(original: dict, migrated: dict) -> float:
    # The DataParallel original saves `module.` keys; the migrated script must not.
    assert not any(key.startswith("module.") for key in migrated)
    original = {key.removeprefix("module."): value for key, value in original.items()}
    assert set(original) == set(migrated)
    return max((original[key] - migrated[key]).abs().max().item() for key in original)


@pytest.mark.slow
@pytest.mark.parametrize("original, migrated", [("original", "plain"), ("original", "two"), ("flat_original", "flat_plain"), ("flat_original", "flat_two"), ("shuffled_original", "shuffled_plain")])
def test_migrated_script_ends_with_the_originals_weights(runs, original, migrated):
    _, folders = runs
    assert _largest_difference(_weights(folders[original]), _weights(folders[migrated])) <= ONE_PROCESS_TOLERANCE


def _epoch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("epoch")]


@pytest.mark.slow
@pytest.mark.parametrize("migrated", ["plain", "two"])
def test_epoch_lines_are_printed_once_with_the_originals_accuracy(runs, migrated):
    # dp_parity.py's lines carry the accuracy on the whole validation set, which every process evaluates.
    launches, _ = runs
    expected = _epoch_lines(launches["original"].stdout)
    assert len(expected) == EPOCHS
    assert _epoch_lines(launches[migrated].stdout) == expected


@pytest.mark.slow
def test_flat_script_prints_its_epoch_lines_once(runs):
    # ddp_plain_flat.py prints the last batch's loss: on 2 processes rank 0's half of it.
    launches, _ = runs
    lines = [_epoch_lines(launches[name].stdout) for name in ("flat_original", "flat_plain", "flat_two")]
    assert len(lines[0]) == 4 and lines[1] == lines[0]
    assert [line.split(":")[0] for line in lines[2]] == [line.split(":")[0] for line in lines[0]]


@pytest.mark.slow
def test_shuffled_world_of_one_trains_in_the_originals_order(runs):
    _, folders = runs
    traces = [sorted(folders[name].glob("seen-*.txt")) for name in ("shuffled_original", "shuffled_plain")]
    assert [len(t) for t in traces] == [1, 1]
    original, migrated = (t[0].read_text().splitlines() for t in traces)
    assert len(original) == EPOCHS and original == migrated and original[0] != original[1]


@pytest.mark.slow
def test_mixed_precision_script_on_a_cpu_computes_the_originals_losses(tmp_path):
    # A CUDA fp16 script with a GradScaler (unscale_ before clipping) moved onto
    # Fabric(precision=...): on a CPU the original's CUDA autocast and scaler were
    # off, and the migrated script asks for "32-true".
    from test_accelerate import MIXED_PRECISION

    migrated_code = _migrate(MIXED_PRECISION).code
    assert 'Fabric(precision="16-mixed" if torch.cuda.is_available() else "32-true", ' in migrated_code
    assert "scaler" not in migrated_code and "autocast" not in migrated_code
    original, migrated = tmp_path / "original.py", tmp_path / "migrated.py"
    original.write_text(MIXED_PRECISION)
    migrated.write_text(migrated_code)
    losses = []
    for script in (original, migrated):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=cpu_env(), cwd=tmp_path, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        losses.append([float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step loss")])
    assert len(losses[0]) == 18 and len(losses[1]) == 18
    assert max(abs(a - b) for a, b in zip(*losses)) <= 1e-6
