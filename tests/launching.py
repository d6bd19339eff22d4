"""Launching scripts from tests: one process or torchrun's two on the CPU,
many at once (each writes to files), and comparing the weights they end with.

Every multi-process test (ddp, accelerate, fabric, accumulate) uses these, so
that a launch reruns the same way after a gloo flake (conftest.GLOO_FLAKE_RERUNS) and every
comparison states the same tolerances.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional

import torch

import warm_python
from conftest import GLOO_FLAKE_RERUNS, SCRIPTS, ended_in_gloo_flake

LAUNCH_TIMEOUT = 600
# Watches the optimizers from outside and saves each rank's parameters (weights-rank*.pt).
RANK_WEIGHTS = SCRIPTS / "ddp_rank_weights.py"
# Both ranks apply the same all-reduced gradients to the same parameters.
RANK_TOLERANCE = 1e-6
# Two processes on half batches against one on whole ones: float sums in another order.
ONE_PROCESS_TOLERANCE = 1e-5

LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SLURM_VARIABLES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_NODELIST", "SLURM_JOB_ID")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_env(**extra: str) -> dict:
    """This environment without a launcher's variables, on the CPU, one thread per process."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES + SLURM_VARIABLES}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    return env


def on_two(script: Path, *args: str) -> list[str]:
    """torchrun's command for `script` on two processes of this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()), str(script), *args]


class Launch:
    """A subprocess writing to files, so that many can run at once."""

    # How many launches work in each folder: a rerun clears only a folder of its own.
    _working_in: dict[Path, int] = {}

    def __init__(self, folder: Path, name: str, command: list[str], env: dict, cwd: Path, outputs: Optional[Path] = None) -> None:
        """`outputs`: a folder of this launch's own that the run writes into (`--out`), cleared as its
        working folder is when the run is rerun."""
        self.name = name
        self.stdout_path, self.stderr_path = folder / f"{name}.out", folder / f"{name}.err"
        self._cwd, self._there_before = cwd, set(cwd.iterdir())
        self._outputs = (outputs, set(outputs.iterdir())) if outputs is not None else None
        Launch._working_in[cwd.resolve()] = Launch._working_in.get(cwd.resolve(), 0) + 1
        self._start = lambda: self._popen(command, env, cwd)
        self._start()

    def _popen(self, command: list[str], env: dict, cwd: Path) -> None:
        if warm_python.runs_warm(command):  # `python script.py`: a child of the warm interpreter
            self.process = warm_python.start(command, env, cwd, self.stdout_path, self.stderr_path)
            return
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=cwd)

    def wait(self, reruns_left: int = GLOO_FLAKE_RERUNS) -> "Launch":
        warm_python.wait_or_kill(self.process, LAUNCH_TIMEOUT)
        self.returncode = self.process.returncode
        self.stdout, self.stderr = self.stdout_path.read_text(), self.stderr_path.read_text()
        if ended_in_gloo_flake(self.returncode, self.stderr) and reruns_left > 0:
            self._clear_outputs()  # what the aborted run wrote (a checkpoint) is not the rerun's
            self._start()  # see conftest.GLOO_FLAKE_RERUNS
            return self.wait(reruns_left - 1)
        return self

    def _clear_outputs(self) -> None:
        """Removes what the aborted run wrote into its working folder, where
        no other launch works (in a shared one the new files are theirs too)."""
        folders = [self._outputs] if self._outputs is not None else []
        if Launch._working_in[self._cwd.resolve()] == 1:
            folders.append((self._cwd, self._there_before))
        for folder, there_before in folders:
            for path in set(folder.iterdir()) - there_before - {self.stdout_path, self.stderr_path}:
                shutil.rmtree(path) if path.is_dir() else path.unlink()

    def succeeded(self) -> "Launch":
        assert self.returncode == 0, f"{self.name}: {self.describe()}"
        return self

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}"


def launch_all(work: Path, plans: dict, env: dict) -> tuple[dict, dict]:
    """Start every plan (name -> command, where "{folder}" stands for a folder
    of its own under `work`, also its working directory) at once; wait for
    all. Returns the finished launches and the folders, by name."""
    folders, started = {}, {}
    for name, command in plans.items():
        folder = folders[name] = work / str(name)
        folder.mkdir()
        started[name] = Launch(work, str(name), [part.format(folder=folder) for part in command], env, folder)
    return {name: launch.wait() for name, launch in started.items()}, folders


def rank_weights(folder: Path) -> list[list[torch.Tensor]]:
    files = sorted(folder.glob("weights-rank*.pt"))
    return [torch.load(f) for f in files]


def largest_parameter_difference(first: list[torch.Tensor], second: list[torch.Tensor]) -> float:
    assert [p.shape for p in first] == [p.shape for p in second]
    return max((a - b).abs().max().item() for a, b in zip(first, second))


def assert_ranks_agree(launch: Launch, folder: Path) -> list[torch.Tensor]:
    """Both ranks finished and hold the same trained parameters; rank 0's."""
    assert launch.returncode == 0, launch.describe()
    ranks = rank_weights(folder)
    assert len(ranks) == 2, f"one weights file per rank: {sorted(p.name for p in folder.iterdir())}"
    assert largest_parameter_difference(*ranks) <= RANK_TOLERANCE, "the ranks trained different models"
    return ranks[0]
