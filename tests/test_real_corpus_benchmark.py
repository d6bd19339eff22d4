"""benchmarks/real_corpus.py over a corpus of our own: a small repository made
here as a bare git snapshot, with a manifest that names it. It is checked out
at the pinned commit, every set of words is applied to a copy of the entry and
its siblings, and the table counts what was applied, what is left and what
changed nothing silently; `--run` runs the original and the copies a few
optimizer steps through the run shim."""

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "real_corpus.py"
_spec = importlib.util.spec_from_file_location("real_corpus_benchmark", _PATH)
corpus = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus)

TRAIN = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

from model import make_model

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, shuffle=True)
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss)
        torch.cuda.empty_cache()
print("final loss:", losses[-1].item())
"""
MODEL = """\
import torch


def make_model():
    return torch.nn.Linear(4, 1)
"""
# trains nothing: no word has anything to do, and says nothing
NO_TRAINING = "print('hello')\n"


def _git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(cwd)})
    return done.stdout.strip()


@pytest.fixture
def snapshot(tmp_path):
    """A bare snapshot of `someone/toy` under tmp/mirror, and a manifest of two entries."""
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "train.py").write_text(TRAIN)
    (work / "src" / "model.py").write_text(MODEL)
    (work / "hello.py").write_text(NO_TRAINING)
    _git("init", "-q", cwd=work)
    _git("add", ".", cwd=work)
    _git("commit", "-q", "-m", "toy", cwd=work)
    commit = _git("rev-parse", "HEAD", cwd=work)
    mirror = tmp_path / "mirror"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(mirror / "someone+toy" / "repo")], check=True)
    manifest = tmp_path / "manifest.tsv"
    rows = [
        "\t".join(corpus.COLUMNS),
        f"someone/toy\t{commit}\tsrc/train.py\tsrc/model.py\t-\ttabular\t2024\tsynthetic\tflat loop, model in a sibling",
        f"someone/toy\t{commit}\thello.py\t-\t-\tother\t2024\tsynthetic\ttrains nothing",
    ]
    manifest.write_text("\n".join(rows) + "\n")
    return mirror, manifest, tmp_path / "repos"


def test_the_manifest_reads_each_column(snapshot):
    _, manifest, _ = snapshot
    first = corpus.read_manifest(manifest)[0]
    assert (first.repo, first.entry, first.siblings, first.args, first.data) == ("someone/toy", "src/train.py", ("src/model.py",), (), "synthetic")
    assert first.runnable_offline


def test_an_entry_in_python_2_is_left_out_and_counted(snapshot, capsys):
    mirror, manifest, repos = snapshot
    checkout = corpus.check_out(corpus.read_manifest(manifest)[1], repos, mirror)
    (checkout / "hello.py").write_text("print 'hello'\n")
    corpus.main(["--repos", str(repos), "--manifest", str(manifest), "--words", "default", "--jobs", "1"])
    assert "1 entries from 1 repositories (1 more whose own code does not parse left out)" in capsys.readouterr().out


def test_a_manifest_line_missing_a_column_is_named(tmp_path):
    manifest = tmp_path / "m.tsv"
    manifest.write_text("\t".join(corpus.COLUMNS) + "\nsomeone/toy\tabc\n")
    with pytest.raises(SystemExit, match=r"m.tsv:2: expected the 9 columns"):
        corpus.read_manifest(manifest)


def test_the_snapshot_is_checked_out_at_its_commit_outside_the_mirror(snapshot):
    mirror, manifest, repos = snapshot
    entry = corpus.read_manifest(manifest)[0]
    checkout = corpus.check_out(entry, repos, mirror)
    assert checkout == repos / "someone+toy"
    assert (checkout / "src" / "model.py").read_text() == MODEL
    assert corpus.check_out(entry, repos, None) == checkout  # already there: no mirror needed


def test_the_table_counts_applied_left_and_silent(snapshot, capsys):
    mirror, manifest, repos = snapshot
    code = corpus.main(["--repos", str(repos), "--mirror", str(mirror), "--manifest", str(manifest), "--words", "default", "--words", "ddp", "--codes", "--jobs", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "2 entries from 1 repositories" in out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in out.splitlines() if line.startswith("| `")}
    # both applied, parse and are idempotent; the default words may rightly change nothing,
    # ddp on a file that trains nothing changes nothing and says nothing: silent
    assert rows["`default`"][:7] == ["2", "2", "2", "2", "2 (100%)", "0", "0"]  # ... and no copy imports accelmigrate
    assert rows["`ddp`"][:4] + rows["`ddp`"][5:6] == ["2", "2", "2", "2", "1"]
    assert "- someone/toy:hello.py `ddp`: silent (ddp changed nothing, said nothing)" in out
    assert "| someone/toy:src/train.py | tabular | full |" in out


@pytest.mark.slow
def test_a_run_reaches_the_step_cap_with_the_same_numbers(snapshot, capsys):
    mirror, manifest, repos = snapshot
    code = corpus.main(["--repos", str(repos), "--mirror", str(mirror), "--manifest", str(manifest), "--words", "default", "--only", "train.py", "--run", "--jobs", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"--run: 1 entries run offline, 1 originals reached {corpus.STEP_CAP} optimizer steps" in out
    row = next(line for line in out.splitlines() if line.startswith("| `default`"))
    regressions, rescues, same = [c.strip() for c in row.split("|")[9:12]]
    assert (regressions, rescues, same) == ("0", "0", "1 of 1")


def test_a_copy_that_stops_is_a_regression_and_other_numbers_are_named():
    entry = corpus.Entry("a/b", "0" * 40, "t.py", (), (), "other", "2024", "synthetic", "")
    migration = corpus.Migration(entry, "default", copy=Path("t.py"), changed=True)
    reached, other, failed = corpus.Run(True, 1.0), corpus.Run(True, 2.0), corpus.Run(False, why="exit 1: boom")
    assert corpus.run_counts([migration], "default", {entry.name: corpus.Ran(reached, {"default": failed})}) == ("1", "0", "0 of 0")
    assert corpus.run_counts([migration], "default", {entry.name: corpus.Ran(failed, {"default": reached})}) == ("0", "1", "0 of 0")
    found = corpus.problems([migration], {entry.name: corpus.Ran(reached, {"default": other})}, {})
    assert found == ["- a/b:t.py `default`: other numbers: 1.0 before, 2.0 after"]


def test_the_run_shim_caps_the_steps_and_writes_a_checksum(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""\
        import torch
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(100):
            optimizer.zero_grad()
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()
        raise SystemExit("the cap should have ended the run before this")
    """))
    run = corpus.run_copy(script, (), "synthetic")
    assert run.reached and run.checksum is not None, run.why


def test_a_run_that_fails_after_a_step_has_not_reached_the_cap(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""\
        import torch
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        raise IndexError("a pre-0.4 loss.data[0] after the first step")
    """))
    run = corpus.run_copy(script, (), "synthetic")
    assert not run.reached and run.why.startswith("exit 1: IndexError"), run.why
