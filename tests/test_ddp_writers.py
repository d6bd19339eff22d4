"""ddp and the writers and loggers of several ranks (codemods/_ddp/writers.py).

- a script that logs to TensorBoard through `tensorboardX.SummaryWriter`
  (main's writer, and the writer given to a helper of the file), keeps a
  `csv.writer` log in a `with open(...)` around its training loop and a
  handle opened with `open(...)`, and stops early on a patience counter in
  the `else:` of its improvement test, migrated with `--to ddp` and
  launched on two gloo processes (torchrun through `accelmigrate run`):
  ends with the one-process original's weights, writes one events file
  (rank 0's) with the original's number of events, and CSV files with the
  original's rows, once each;
- the migrated code: the writer made on rank 0 with a NullWriter elsewhere,
  the files opened as os.devnull on the other ranks, wandb disabled there,
  each test on the way to the early exit decided by rank 0; a writer read
  other than through its methods is left with a finding; a print of a value
  the model computes prints to a NullWriter on the other ranks (every rank
  still computes it), once; a loop in an imported function gets a finding
  that names it.

tensorboard is not installed here: the launch puts a small `tensorboardX`
module beside the script (ddp recognises the writer by its qualified name,
`tensorboardX.SummaryWriter`, so the migration is the one real code gets;
the module writes one events file per writer it makes).
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from accelmigrate.engine.migrate import migrate_source

from conftest import run_cli
from launching import ONE_PROCESS_TOLERANCE, RANK_WEIGHTS, Launch, assert_ranks_agree, cpu_env, largest_parameter_difference, rank_weights
from accelmigrate.runtime.rank_zero import NullWriter

# Writes what it is given, one events file per writer (the process id names it).
TENSORBOARD_STAND_IN = textwrap.dedent(
    """\
    import os


    class SummaryWriter:
        def __init__(self, log_dir):
            os.makedirs(log_dir, exist_ok=True)
            self._file = open(os.path.join(log_dir, f"events.{os.getpid()}"), "w")

        def add_scalar(self, tag, value, step):
            self._file.write(f"{tag} {step} {value}\\n")

        def add_histogram(self, tag, values, step):
            self._file.write(f"{tag} {step} histogram of {values.numel()}\\n")

        def close(self):
            self._file.close()
    """
)

SCRIPT = textwrap.dedent(
    """\
    import argparse
    import csv
    import os

    import torch
    from tensorboardX import SummaryWriter
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    def log_weights(writer, net, epoch):
        for name, param in net.named_parameters():
            writer.add_histogram(name, param.detach(), epoch)


    def validate(net, x, y):
        with torch.no_grad():
            return nn.functional.cross_entropy(net(x), y).item()


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--out", required=True)
        args = parser.parse_args()
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(256, 6, generator=generator)
        y = (x[:, :2].sum(1) > 0).long()
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
        model = nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        writer = SummaryWriter(os.path.join(args.out, "tb"))
        summary_file = open(os.path.join(args.out, "summary.csv"), "w", newline="")
        summary = csv.writer(summary_file)
        best, wait, patience, min_delta = float("inf"), 0, 2, 0.05
        with open(os.path.join(args.out, "epochs.csv"), "w", newline="") as handle:
            log = csv.writer(handle)
            log.writerow(["epoch", "loss"])
            for epoch in range(20):
                for xb, yb in loader:
                    optimizer.zero_grad()
                    loss = nn.functional.cross_entropy(model(xb), yb)
                    loss.backward()
                    optimizer.step()
                val = validate(model, x, y)
                print(f"validation at epoch {epoch}: {validate(model, x, y):.4f}")
                writer.add_scalar("val", val, epoch)
                log_weights(writer, model, epoch)
                log.writerow([epoch, f"{val:.6f}"])
                if val < best - min_delta:
                    best, wait = val, 0
                else:
                    wait += 1
                    if wait >= patience:
                        break
        summary.writerow(["epochs", epoch + 1])
        summary_file.close()
        writer.close()


    if __name__ == "__main__":
        main()
    """
)


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    work = tmp_path_factory.mktemp("writers")
    original, migrated = work / "original.py", work / "train.py"
    original.write_text(SCRIPT)
    migrated.write_text(SCRIPT)
    (work / "tensorboardX.py").write_text(TENSORBOARD_STAND_IN)
    applied = run_cli("apply", str(migrated), "--to", "ddp", cwd=work)
    assert "NullWriter()" in migrated.read_text(), applied.stdout + applied.stderr
    python, env = sys.executable, cpu_env()
    folders = {"original": work / "original", "ddp": work / "ddp"}
    for folder in folders.values():
        folder.mkdir()
    started = {
        "original": Launch(work, "original", [python, str(RANK_WEIGHTS), str(folders["original"]), str(original), "--out", str(folders["original"])], env, work),
        "ddp": Launch(
            work, "ddp",
            [python, "-m", "accelmigrate", "run", "--nproc-per-node", "2", "--force", str(RANK_WEIGHTS), "--",
             str(folders["ddp"]), str(migrated), "--out", str(folders["ddp"])],
            env, work,
        ),
    }
    return {name: launch.wait() for name, launch in started.items()}, folders


@pytest.mark.slow
def test_two_ranks_end_with_the_one_process_weights_after_stopping_early(launches):
    done, folders = launches
    assert done["original"].returncode == 0, done["original"].describe()
    weights = assert_ranks_agree(done["ddp"], folders["ddp"])
    (one_process,) = rank_weights(folders["original"])
    assert largest_parameter_difference(one_process, weights) <= ONE_PROCESS_TOLERANCE
    epochs = (folders["original"] / "summary.csv").read_text()
    assert epochs.startswith("epochs,") and int(epochs.split(",")[1]) < 20, "the original stops early"


@pytest.mark.slow
def test_only_rank_zero_writes_the_events_and_the_csv_logs(launches):
    """Before: each rank made its own events file and both wrote the same CSV files at once."""
    done, folders = launches
    assert done["ddp"].returncode == 0, done["ddp"].describe()
    ddp_events = sorted((folders["ddp"] / "tb").iterdir())
    (original_events,) = sorted((folders["original"] / "tb").iterdir())
    assert len(ddp_events) == 1, [p.name for p in ddp_events]
    original_lines = original_events.read_text().splitlines()
    ddp_lines = ddp_events[0].read_text().splitlines()
    assert [line.split()[:2] for line in ddp_lines] == [line.split()[:2] for line in original_lines]
    for name in ("summary.csv", "epochs.csv"):
        original_rows = (folders["original"] / name).read_text().splitlines()
        ddp_rows = (folders["ddp"] / name).read_text().splitlines()
        assert [row.split(",")[0] for row in ddp_rows] == [row.split(",")[0] for row in original_rows], name
    assert (folders["ddp"] / "summary.csv").read_text() == (folders["original"] / "summary.csv").read_text()


@pytest.mark.slow
def test_a_print_of_a_value_the_model_computes_is_printed_once(launches):
    """Every rank still runs the model for it (its forward may join collectives); rank 0 alone prints."""
    done, _ = launches
    assert done["ddp"].returncode == 0, done["ddp"].describe()
    printed = [line for line in done["ddp"].stdout.splitlines() if "validation at epoch" in line]
    original = [line for line in done["original"].stdout.splitlines() if "validation at epoch" in line]
    assert len(printed) == len(original) > 0, done["ddp"].stdout


def test_the_migrated_writers_and_files_are_rank_zeros():
    code = migrate_source(SCRIPT, [("ddp", {})], "train.py").code
    assert 'writer = SummaryWriter(os.path.join(args.out, "tb")) if is_main_process() else NullWriter()\n' in code
    assert 'open(os.path.join(args.out, "summary.csv") if is_main_process() else os.devnull, "w", newline="")' in code
    assert 'with open(os.path.join(args.out, "epochs.csv") if is_main_process() else os.devnull, "w", newline="") as handle:' in code
    assert "            if rank_zero_decides(val < best - min_delta):\n" in code
    assert "                if rank_zero_decides(wait >= patience):\n" in code
    # the lines that log still run on every rank, unguarded
    assert 'print(f"validation at epoch {epoch}: {validate(model, x, y):.4f}", file=None if is_main_process() else NullWriter())' in code
    assert '            writer.add_scalar("val", val, epoch)\n' in code
    assert "            log_weights(writer, model, epoch)\n" in code


def test_a_null_writer_takes_every_call_and_writes_nothing():
    writer = NullWriter()
    assert writer.add_scalar("loss", 1.0, 0) is None and writer.flush() is None and writer.close() is None
    with writer as entered:
        assert entered is writer
    assert writer is not None and bool(writer)


WANDB_SCRIPT = textwrap.dedent(
    """\
    import torch
    import wandb
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        run = wandb.init(project="demo"MODE)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            run.log({"loss": loss.item()})
        wandb.finish()


    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.parametrize(
    "mode, expected",
    [("", 'mode=None if is_main_process() else "disabled"'), (', mode="offline"', 'mode="offline" if is_main_process() else "disabled"')],
)
def test_wandb_runs_disabled_on_the_other_ranks(mode, expected):
    code = migrate_source(WANDB_SCRIPT.replace("MODE", mode), [("ddp", {})], "train.py").code
    assert f'run = wandb.init(project="demo", {expected})' in code
    assert '        run.log({"loss": loss.item()})\n' in code  # a no-op on a disabled run


def test_a_writer_whose_folder_is_read_stays_with_a_finding():
    source = SCRIPT.replace(
        '    summary_file = open(os.path.join(args.out, "summary.csv"), "w", newline="")\n',
        '    summary_file = open(os.path.join(writer.logdir, "summary.csv"), "w", newline="")\n',
    )
    assert "writer.logdir" in source
    result = migrate_source(source, [("ddp", {})], "train.py")
    left = [f for f in result.findings if f.code == "AM528" and not f.fixed]
    assert left and "writer.logdir" in left[0].message
    assert '    writer = SummaryWriter(os.path.join(args.out, "tb"))\n' in result.code


@pytest.mark.parametrize(
    "imports, call, qualified",
    [
        ("from train_lib import train", "train", "train_lib.train"),
        ("import engine", "engine.fit", "engine.fit"),
        ("from .loops import train", "train", ".loops.train"),
    ],
)
def test_a_training_loop_in_an_imported_function_is_named(imports, call, qualified):
    source = textwrap.dedent(
        f"""\
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        {imports}


        def main():
            loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
            model = nn.Linear(4, 1)
            optimizer = torch.optim.Adam(model.parameters())
            {call}(model, optimizer, loader, epochs=3)


        if __name__ == "__main__":
            main()
        """
    )
    result = migrate_source(source, [("ddp", {})], "train.py")
    (finding,) = [f for f in result.findings if f.code == "AM521"]
    assert not finding.fixed and finding.message.startswith(f"the training loop runs in `{qualified}`")
    assert result.code == source


def test_an_imported_function_given_only_the_model_is_no_training_loop():
    source = textwrap.dedent(
        """\
        import torch
        from torch import nn
        from metrics import report


        def main():
            model = nn.Linear(4, 1)
            optimizer = torch.optim.Adam(model.parameters())
            report(model)


        if __name__ == "__main__":
            main()
        """
    )
    findings = migrate_source(source, [("ddp", {})], "train.py").findings
    assert not any("training loop runs in" in f.message for f in findings)
