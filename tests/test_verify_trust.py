"""`accelmigrate verify` where it could not be trusted: no optimizer step
seen, a CUDA-only original on a machine without CUDA, dropout under
accumulation, the words of `[tool.accelmigrate]`, runs that shared the
project's folder, a script in latin-1, and a verify stopped by a signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from accelmigrate.launch.verify import EXIT_ERROR, EXIT_INTERRUPTED, verify_command

from conftest import SCRIPTS

pytestmark = pytest.mark.slow

LOADER_SCRIPT = '''
import sys
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

generator = torch.Generator().manual_seed(0)
x = torch.randn(128, 6, generator=generator)
y = x.sum(dim=1, keepdim=True)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)
torch.manual_seed(0)
model = nn.Linear(6, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for xb, yb in loader:
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    optimizer.step()
'''


def run_verify(*args: str):
    result = CliRunner().invoke(verify_command, list(args), catch_exceptions=False)
    output = result.output
    return result.exit_code, (json.loads(output) if output.lstrip().startswith("{") else output)


def project_with(tmp_path: Path, *names: str) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    for name in names:
        (project / name).write_bytes((SCRIPTS / name).read_bytes())
    return project


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"") for p in sorted(folder.rglob("*"))}


def test_no_optimizer_step_is_not_a_verdict(tmp_path):
    # A hand-written update: the weights change, but no optimizer steps.
    script = tmp_path / "by_hand.py"
    script.write_text(
        LOADER_SCRIPT.replace("    optimizer.step()\n", "    with torch.no_grad():\n        model.weight -= 0.05 * model.weight.grad\n")
    )
    code, output = run_verify(str(script), "--to", "workers", "--steps", "3")
    assert code == EXIT_ERROR == 2, output
    assert "no optimizer step was recorded" in output
    assert "same" not in output


@pytest.mark.skipif(torch.cuda.is_available(), reason="the original's CUDA placements are mapped only without CUDA")
@pytest.mark.parametrize("words", ["device,amp", "checklist"])
def test_a_cuda_only_script_verifies_on_a_machine_without_cuda(tmp_path, words):
    project = project_with(tmp_path, "verify_cuda_placements.py")
    script = project / "verify_cuda_placements.py"
    code, output = run_verify(str(script), "--to", words, "--steps", "4")
    assert code == 0, output
    assert "same: 4 steps agree" in output
    assert "the original's CUDA placements ran on cpu" in output


def test_dropout_under_accumulation_is_named_in_the_verdict(tmp_path):
    project = project_with(tmp_path, "verify_dropout_accumulate.py")
    code, result = run_verify(str(project / "verify_dropout_accumulate.py"), "--to", "accumulate=2", "--steps", "2", "--json")
    assert code == 1, result
    assert result["verdict"] == "differ"
    assert result["random_per_forward"] == ["dropout"]
    assert "draws random numbers per forward (dropout)" in result["expected"]
    assert "split into micro-batches" in result["expected"]


def test_dropout_off_is_not_named(tmp_path):
    script = tmp_path / "no_dropout.py"
    script.write_text((SCRIPTS / "verify_dropout_accumulate.py").read_text().replace("nn.Dropout(0.3)", "nn.Dropout(0.0)"))
    code, result = run_verify(str(script), "--to", "accumulate=2", "--steps", "2", "--json")
    assert code == 0, result
    assert result["random_per_forward"] == [] and result["expected"] is None


def test_the_words_and_options_of_the_pyproject_are_verified(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[tool.accelmigrate]\nto = ["accumulate"]\n\n[tool.accelmigrate.options.accumulate]\nvalue = "4"\n')
    (project / "train.py").write_text(LOADER_SCRIPT)
    code, result = run_verify(str(project / "train.py"), "--steps", "2", "--json")
    assert code == 0, result
    assert result["words"] == ["accumulate"]
    assert result["reference_batch_scale"] == 4
    # The command line wins over the file.
    code, result = run_verify(str(project / "train.py"), "--to", "empty-cache", "--json")
    assert (code, result["words"], result["verdict"]) == (0, ["empty-cache"], "unchanged")


def test_each_run_has_a_folder_of_its_own_and_the_project_is_left_as_it_was(tmp_path, monkeypatch):
    # The script resumes from a checkpoint in the current folder and saves one
    # each step: had the migrated run found the original's, it would differ.
    # It also reads a file beside itself and imports itself by its own name.
    project = project_with(tmp_path, "verify_resumed_checkpoint.py", "verify_resumed_checkpoint.json")
    (project / "data").mkdir()
    (project / "data" / "big.bin").write_bytes(b"\0" * (17 * 1024 * 1024))  # linked, not copied
    before = listing(project)
    monkeypatch.chdir(project)
    code, output = run_verify("verify_resumed_checkpoint.py", "--to", "device,amp", "--steps", "5")
    assert code == 0, output
    assert "same: 5 steps agree" in output
    assert listing(project) == before  # no checkpoint, no copy, no run folder


def test_a_latin1_script_is_copied_in_latin1(tmp_path):
    # Read as UTF-8 the copy's "é" would be two characters, and the script stops.
    source = "# -*- coding: latin-1 -*-\nassert len('\u00e9') == 1, 'garbled copy'\n" + LOADER_SCRIPT
    script = tmp_path / "latin.py"
    script.write_bytes(source.encode("latin-1"))
    code, output = run_verify(str(script), "--to", "workers", "--steps", "2")
    assert code == 0, output
    assert "same: 2 steps agree" in output


SLEEPING_SCRIPT = LOADER_SCRIPT.replace(
    "import sys\n",
    "import os, subprocess, sys, time\n"
    "helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "with open(sys.argv[1] + '.tmp', 'w') as handle:\n"
    "    handle.write(f'{os.getpid()} {helper.pid}')\n"
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n",
).replace("    optimizer.step()\n", "    optimizer.step()\n    time.sleep(0.5)\n")
LIVENESS_S = 120  # a bound on waiting, not a measurement


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as status:
            return status.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum, exit_code", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGHUP, 128 + signal.SIGHUP), (signal.SIGINT, EXIT_INTERRUPTED)])
def test_a_stopped_verify_stops_its_runs_and_removes_its_folders(tmp_path, signum, exit_code):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(SLEEPING_SCRIPT)
    temporary, pids = tmp_path / "tmp", tmp_path / "pids"
    temporary.mkdir()
    before = listing(project)
    verify = subprocess.Popen(
        [sys.executable, "-m", "accelmigrate", "verify", str(project / "train.py"), "--to", "workers", "--steps", "1000", "--", str(pids)],
        env={**os.environ, "TMPDIR": str(temporary), "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    while not pids.exists():  # the original has started
        assert verify.poll() is None, verify.communicate()[0].decode()
        time.sleep(0.2)
    time.sleep(1)  # into its training loop
    script_pid, helper_pid = map(int, pids.read_text().split())
    verify.send_signal(signum)
    output = verify.communicate(timeout=LIVENESS_S)[0].decode()
    assert verify.returncode == exit_code, output
    deadline = time.monotonic() + LIVENESS_S  # orphans are reaped by init once verify is gone
    while not (_gone(script_pid) and _gone(helper_pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gone(script_pid) and _gone(helper_pid)
    assert [p.name for p in temporary.glob("accelmigrate-verify-*")] == []
    assert listing(project) == before
