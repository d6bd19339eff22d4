"""A script run by the warm interpreter (tests/warm_python.py) behaves as
`python script.py` does: the same output, exit code, `__file__`,
`sys.argv`, `sys.path[0]`, working directory and environment, its
`atexit` handlers run, an unclosed file flushed as the interpreter ends, and
torch's generator seeded afresh."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import warm_python

SCRIPT = """\
import atexit, os, sys

print(__name__, __file__, sys.argv, sys.path[0], os.getcwd(), os.environ.get("WARM_PROBE"))
written = open("unclosed.txt", "w")
written.write("flushed at exit")
atexit.register(print, "atexit ran")
if sys.argv[1:] == ["raise"]:
    raise ValueError("raised at top level")
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
"""


@pytest.mark.parametrize("arguments", [[], ["3"], ["raise"]], ids=["ends", "exits-3", "raises"])
def test_a_warm_run_is_a_cold_run(arguments, tmp_path: Path):
    runs = {}
    for way in ("cold", "warm"):
        folder = tmp_path / way  # the same relative command in folders of the same shape
        folder.mkdir()
        (folder / "train.py").write_text(SCRIPT)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", "WARM_PROBE": way}
        command = [sys.executable, "train.py", *arguments]
        if way == "cold":
            runs[way] = subprocess.run(command, capture_output=True, text=True, env=env, cwd=folder, timeout=120)
        else:
            assert warm_python.runs_warm(command)
            runs[way] = warm_python.run(command, env, folder, timeout=120)
        assert (folder / "unclosed.txt").read_text() == "flushed at exit"
    cold, warm = runs["cold"], runs["warm"]
    assert warm.returncode == cold.returncode == {"3": 3, "raise": 1}.get("".join(arguments), 0)
    assert warm.stdout == cold.stdout.replace("/cold", "/warm").replace(" cold\n", " warm\n")
    assert "atexit ran" in warm.stdout
    assert warm.stderr.strip().splitlines()[-1:] == cold.stderr.strip().splitlines()[-1:]


def test_each_warm_run_seeds_torch_afresh_as_a_new_interpreter_does(tmp_path: Path):
    (tmp_path / "seed.py").write_text("import torch\nprint(torch.initial_seed())\n")
    seeds = {warm_python.run([sys.executable, "seed.py"], dict(os.environ), tmp_path, timeout=60).stdout for _ in range(2)}
    assert len(seeds) == 2


def test_a_warm_module_run_is_a_cold_one(tmp_path: Path):
    (tmp_path / "train.py").write_text("import torch\nloss = torch.ones(2).cuda().sum()\n")
    command = [sys.executable, "-m", "accelmigrate", "check", "--no-cache", "train.py"]
    assert warm_python.runs_warm(command)
    warm = warm_python.run(command, dict(os.environ), tmp_path, timeout=120)
    cold = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert "1 file(s) checked" in warm.stderr


def test_a_command_the_warm_interpreter_cannot_be_runs_as_a_subprocess(tmp_path: Path):
    assert not warm_python.runs_warm([sys.executable, "-c", "print(1)"])
    assert not warm_python.runs_warm(["torchrun", "train.py"])
    done = warm_python.run([sys.executable, "-c", "import sys; print(sys.argv)"], dict(os.environ), tmp_path, timeout=60)
    assert done.stdout.strip() == "['-c']"
