"""ddp and the files and folders of several ranks, and what sync-bn adds.

- a script migrated with `--to ddp` and launched on two gloo processes (the
  launches of test_ddp.py: torchrun through `accelmigrate run`, the weights
  watched from outside) ends with the weights of the one-process original:
  ImageNet's `save_checkpoint` copies the file rank 0 alone wrote
  (`shutil.copyfile` under `if is_best:`) on rank 0 only; `if not
  os.path.exists(d): os.mkdir(d)` runs on both ranks at once without a
  FileExistsError; a checkpoint saved at the end of each epoch and loaded by
  every rank at the start of the next is whole when it is read;
- a model built with BatchNorm layers gets a note pointing to sync-bn, one
  without gets none; sync-bn converts nothing in a model without BatchNorm,
  on the first run and on later ones.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from accelmigrate.engine.migrate import migrate_source

from conftest import run_cli
from launching import ONE_PROCESS_TOLERANCE, RANK_WEIGHTS, Launch, assert_ranks_agree, cpu_env, largest_parameter_difference, rank_weights

SCRIPT = textwrap.dedent(
    """\
    import argparse
    import os
    import shutil

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    def save_checkpoint(state, is_best, filename):
        torch.save(state, filename)
        if is_best:
            shutil.copyfile(filename, filename + ".best")


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--out", required=True)
        parser.add_argument("--reload", action="store_true")
        args = parser.parse_args()
        out = os.path.join(args.out, "run")
        if not os.path.exists(out):
            os.mkdir(out)
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(256, 6, generator=generator)
        loader = DataLoader(TensorDataset(x, (x[:, :2].sum(1) > 0).long()), batch_size=16)
        model = nn.Sequential(nn.Linear(6, 256), nn.Tanh(), nn.Linear(256, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        last = os.path.join(out, "last.pt")
        for epoch in range(4):
            if args.reload and epoch > 0:
                model.load_state_dict(torch.load(last))
            for xb, yb in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                optimizer.step()
            torch.save(model.state_dict(), last)
            save_checkpoint({"epoch": epoch, "state": model.state_dict()}, epoch % 2 == 0, os.path.join(out, "checkpoint.pt"))


    if __name__ == "__main__":
        main()
    """
)
# (name, arguments, whether the run folder exists before the launch)
CASES = [("copy", (), True), ("mkdir", (), False), ("reload", ("--reload",), True)]


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    work = tmp_path_factory.mktemp("output-trust")
    original, migrated = work / "original.py", work / "train.py"
    original.write_text(SCRIPT)
    migrated.write_text(SCRIPT)
    applied = run_cli("apply", str(migrated), "--to", "ddp", cwd=work)
    assert "DistributedDataParallel" in migrated.read_text(), applied.stdout + applied.stderr
    python, env = sys.executable, cpu_env()
    two = [python, "-m", "accelmigrate", "run", "--nproc-per-node", "2", "--force", str(RANK_WEIGHTS), "--"]
    started, folders = {}, {}
    for name, args, made in [("original", ("--reload",), False), *CASES]:
        folder = folders[name] = work / name
        (folder / "run").mkdir(parents=True) if made else folder.mkdir()
        if name == "original":
            command = [python, str(RANK_WEIGHTS), str(folder), str(original), "--out", str(folder), *args]
        else:
            command = [*two, str(folder), str(migrated), "--out", str(folder), *args]
        started[name] = Launch(work, name, command, env, work)
    return {name: launch.wait() for name, launch in started.items()}, folders


def _ends_with_the_original_weights(launches, folders, name: str) -> None:
    weights = assert_ranks_agree(launches[name], folders[name])
    assert launches["original"].returncode == 0, launches["original"].describe()
    (one_process,) = rank_weights(folders["original"])
    assert largest_parameter_difference(one_process, weights) <= ONE_PROCESS_TOLERANCE


@pytest.mark.slow
def test_the_copy_of_rank_zeros_checkpoint_is_made_by_rank_zero(launches):
    """Before: rank 1 copied a file it never wrote (FileNotFoundError)."""
    done, folders = launches
    assert "FileNotFoundError" not in done["copy"].stderr, done["copy"].describe()
    _ends_with_the_original_weights(done, folders, "copy")
    best = torch.load(folders["copy"] / "run" / "checkpoint.pt.best")
    assert best["epoch"] == 2


@pytest.mark.slow
def test_a_folder_made_when_missing_is_made_on_both_ranks_at_once(launches):
    """Before: the second rank to reach `os.mkdir` failed (FileExistsError)."""
    done, folders = launches
    assert "FileExistsError" not in done["mkdir"].stderr, done["mkdir"].describe()
    _ends_with_the_original_weights(done, folders, "mkdir")
    assert (folders["mkdir"] / "run" / "last.pt").exists()


@pytest.mark.slow
def test_a_checkpoint_read_in_the_next_epoch_is_whole(launches):
    """Before: rank 1 read `last.pt` while rank 0 was writing it, or before."""
    done, folders = launches
    _ends_with_the_original_weights(done, folders, "reload")


def test_the_save_copy_and_reload_are_ordered_in_the_migrated_code():
    code = migrate_source(SCRIPT, [("ddp", {})], "train.py").code
    assert "    if is_main_process():\n        torch.save(state, filename)\n        if is_best:\n            shutil.copyfile(" in code
    assert "        os.makedirs(out, exist_ok=True)\n" in code
    assert "            torch.save(unwrap_model(model).state_dict(), last)\n        barrier()\n" in code


BATCH_NORM_SCRIPT = textwrap.dedent(
    """\
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        loader = DataLoader(data, batch_size=16)
        model = nn.Sequential(nn.Linear(4, 8), LAYER, nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()


    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.parametrize("layer, noted", [("nn.BatchNorm1d(8)", True), ("nn.ReLU()", False)])
def test_a_batch_norm_model_under_ddp_gets_a_note_pointing_to_sync_bn(layer, noted):
    findings = migrate_source(BATCH_NORM_SCRIPT.replace("LAYER", layer), [("ddp", {})], "train.py").findings
    notes = [f for f in findings if f.code == "AM538"]
    assert bool(notes) == noted
    assert all("--to sync-bn" in f.message and not f.fixed for f in notes)


@pytest.mark.parametrize("model", ["nn.Linear(4, 1)", "nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))"])
def test_sync_bn_adds_nothing_to_a_model_without_batch_norm_on_any_run(model):
    source = BATCH_NORM_SCRIPT.replace("nn.Sequential(nn.Linear(4, 8), LAYER, nn.Linear(8, 1))", model)
    plan = [("ddp", {}), ("sync-bn", {})]
    first = migrate_source(source, plan, "train.py").code
    second = migrate_source(first, plan, "train.py").code
    assert "DistributedDataParallel(model" in first
    assert "convert_sync_batchnorm" not in first and second == first


RESUMED = """\
import argparse
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--resume", default="")
args = parser.parse_args()


def save(model, path):
    torch.save(model.state_dict(), path)


def main():
    model = nn.Linear(2, 2)
    if args.resume:
        model.load_state_dict(torch.load(args.resume))  # before anything is saved
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        save(model, "last.pt")
    model.load_state_dict(torch.load("last.pt"))  # after the saves


if __name__ == "__main__":
{call}
"""


@pytest.mark.parametrize(
    "call, warned",
    [
        ("    main()", ["model.load_state_dict(torch.load(\"last.pt\"))"]),
        # per fold, the resume of the second call may read what the first saved
        ("    for fold in range(2):\n        main()", ["model.load_state_dict(torch.load(args.resume))", "model.load_state_dict(torch.load(\"last.pt\"))"]),
    ],
)
def test_a_load_before_any_save_of_the_run_needs_no_barrier(call, warned):
    source = RESUMED.format(call=call)
    result = migrate_source(source, [("ddp", {})], "train.py")
    lines = source.splitlines()
    left = [lines[f.line - 1].strip().split("  #")[0] for f in result.findings if f.code == "AM528" and "between the save and the load" in f.message]
    assert left == warned
