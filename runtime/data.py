"""DataLoader settings sized to this process's share of the machine.

`default_num_workers()`: how many loader worker processes this process should
start. It divides the CPU cores this process may run on (its affinity mask,
which container limits, `taskset` and SLURM's `--cpus-per-task` shrink) among
the processes of the launch that share this machine (torchrun's
LOCAL_WORLD_SIZE), so that a script that later runs as eight DDP processes on
one node does not start eight times too many workers.
"""

from __future__ import annotations

import os
from typing import Optional

from . import env

# Why a cap: past about eight workers a typical loader stops getting faster
# (the training step, not decoding, becomes the bottleneck), while every
# worker still costs start-up time, a copy of the dataset object (Python's
# reference counts defeat copy-on-write) and prefetched batches in shared
# memory. Nodes with 100+ cores and one process would otherwise start 100+.
DEFAULT_MAX_WORKERS = 8


def available_cores() -> int:
    """CPU cores this process may run on (not merely the machine's count)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        try:
            return max(1, len(affinity(0)))
        except OSError:
            pass
    return os.cpu_count() or 1


def default_num_workers(max_workers: Optional[int] = DEFAULT_MAX_WORKERS) -> int:
    """Loader workers for this process: its cores shared among the processes
    of this launch on this machine, at least 1, at most `max_workers`
    (None: no cap)."""
    if max_workers is not None and max_workers < 1:
        raise ValueError(f"max_workers must be at least 1, got {max_workers}")
    workers = max(1, available_cores() // max(1, env.local_world_size()))
    if max_workers is not None:
        workers = min(workers, max_workers)
    return workers


__all__ = ["DEFAULT_MAX_WORKERS", "available_cores", "default_num_workers"]
