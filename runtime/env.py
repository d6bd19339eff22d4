"""Where this process sits in a launch: rank, local rank, world size.

Read from torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE), else from SLURM's when srun started one task per GPU
(SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE), else a
world of one process: a script run with plain `python train.py`.
"""

from __future__ import annotations

import os
from typing import Optional


def _int_env(*names: str) -> Optional[int]:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return int(value.split("(")[0].split(",")[0])  # SLURM writes e.g. "4(x2)"
            except ValueError:
                continue
    return None


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launched_by_slurm_tasks() -> bool:
    """srun started one task per process (and not torchrun inside SLURM)."""
    return not launched_by_torchrun() and (_int_env("SLURM_NTASKS") or 1) > 1 and "SLURM_PROCID" in os.environ


def rank() -> int:
    if launched_by_torchrun():
        return _int_env("RANK") or 0
    if launched_by_slurm_tasks():
        return _int_env("SLURM_PROCID") or 0
    return 0


def local_rank() -> int:
    if launched_by_torchrun():
        return _int_env("LOCAL_RANK") or 0
    if launched_by_slurm_tasks():
        return _int_env("SLURM_LOCALID") or 0
    return _int_env("LOCAL_RANK") or 0


def world_size() -> int:
    if launched_by_torchrun():
        return _int_env("WORLD_SIZE") or 1
    if launched_by_slurm_tasks():
        return _int_env("SLURM_NTASKS") or 1
    return 1


def local_world_size() -> int:
    """Processes of this launch on this machine (they share its CPU cores)."""
    if launched_by_torchrun():
        return _int_env("LOCAL_WORLD_SIZE") or 1
    if launched_by_slurm_tasks():
        return _int_env("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE") or 1
    return 1


def is_main_process() -> bool:
    return rank() == 0
