"""SLURM for `accelmigrate run`: write an sbatch script, or read the allocation.

Two ways onto a SLURM cluster, both ending in one torchrun per node that
starts one process per GPU there, all meeting at the first node of the job
(c10d rendezvous, the job id as rendezvous id):

- `accelmigrate run --slurm-script job.sbatch ... train.py -- ARGS` writes a
  batch script (`sbatch_script`) whose `srun` starts that torchrun on every
  node; the user submits it with `sbatch job.sbatch`.
- `srun --ntasks-per-node=1 accelmigrate run train.py` inside an allocation
  of several nodes: `placement_from_env` derives the number of nodes and the
  rendezvous endpoint from SLURM's environment.

(A script started by `srun` with one task per GPU, without torchrun, needs
none of this: `accelmigrate.runtime.env` reads SLURM's task variables.)

Nothing here imports torch.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import PurePath
from typing import Mapping, Optional, Sequence

RENDEZVOUS_PORT = 29500


class SlurmError(ValueError):
    """The SLURM environment cannot host this launch as it was started."""


@dataclass(frozen=True)
class Placement:
    """Where this node's torchrun meets the others."""

    nnodes: int
    rdzv_endpoint: str
    rdzv_id: str


# --- the allocation this process runs in -----------------------------------------


def placement_from_env(environ: Mapping[str, str], first_host=None) -> Optional[Placement]:
    """The multi-node placement of an `srun` step that runs one task per node;
    None outside SLURM or on a single node (a plain local launch).

    Raises SlurmError when the allocation has several nodes but this process
    was not started once per node (started once from the batch script, or by
    an srun with one task per GPU): torchrun would wait for nodes that never
    come, or start too many processes.
    """
    job_nodes = _int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES"))
    if job_nodes is None:
        return None
    step_nodes = _int(environ.get("SLURM_STEP_NUM_NODES"))
    step_tasks = _int(environ.get("SLURM_STEP_NUM_TASKS"))
    if step_nodes is None or step_tasks is None:
        if job_nodes > 1:
            raise SlurmError(
                f"this SLURM allocation has {job_nodes} nodes but `accelmigrate run` was started once, "
                "outside `srun`: start it on every node with `srun --ntasks-per-node=1 accelmigrate run ...`, "
                "write a batch script with `--slurm-script`, or pass `--nnodes 1` to use this node only"
            )
        return None
    if step_tasks != step_nodes:
        raise SlurmError(
            f"srun started {step_tasks} tasks on {step_nodes} nodes; `accelmigrate run` needs one task per node "
            "(`srun --ntasks-per-node=1`): torchrun starts the processes of each node. (A script started by "
            "srun with one task per GPU runs without `accelmigrate run`.)"
        )
    if step_nodes == 1:
        return None
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
    head = (first_host or first_hostname)(nodelist)
    return Placement(
        nnodes=step_nodes,
        rdzv_endpoint=f"{head}:{RENDEZVOUS_PORT}",
        rdzv_id=environ.get("SLURM_JOB_ID", "accelmigrate"),
    )


def first_hostname(nodelist: str) -> str:
    """The first host of a SLURM node list, as `scontrol show hostnames` gives
    it when scontrol is there, else from our own expansion of the list."""
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            shown = subprocess.run(
                [scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
            ).stdout.split()
            if shown:
                return shown[0]
        except (OSError, subprocess.SubprocessError):
            pass
    hosts = expand_hostlist(nodelist)
    if not hosts:
        raise SlurmError(f"cannot read the SLURM node list {nodelist!r}")
    return hosts[0]


def expand_hostlist(nodelist: str) -> list[str]:
    """`node[01-03,07],gpu5` -> node01 node02 node03 node07 gpu5 (zero padding kept;
    several bracket groups in one name expand as a product)."""
    hosts: list[str] = []
    for item in _split_top_level(nodelist):
        hosts.extend(_expand_one(item))
    return hosts


def _split_top_level(nodelist: str) -> list[str]:
    items, depth, current = [], 0, []
    for char in nodelist.strip():
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        current.append(char)
    items.append("".join(current))
    return [item for item in items if item]


_BRACKET = re.compile(r"\[([^\]]*)\]")


def _expand_one(name: str) -> list[str]:
    match = _BRACKET.search(name)
    if not match:
        return [name]
    prefix, rest = name[: match.start()], name[match.end() :]
    tails = _expand_one(rest)
    return [prefix + value + tail for value in _expand_ranges(match.group(1)) for tail in tails]


def _expand_ranges(spec: str) -> list[str]:
    values = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        if not high:
            values.append(low)
            continue
        width = len(low)
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def _int(value: Optional[str]) -> Optional[int]:
    try:
        return int(str(value).split("(")[0])
    except ValueError:
        return None


# --- the batch script -------------------------------------------------------------


@dataclass(frozen=True)
class BatchJob:
    """What the sbatch header asks SLURM for."""

    nodes: int = 1
    gpus_per_node: int = 1
    nproc_per_node: Optional[int] = None  # processes per node; default: one per GPU
    time: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    job_name: Optional[str] = None
    cpus_per_task: Optional[int] = None
    max_restarts: int = 0


def sbatch_script(script: str, script_args: Sequence[str], job: BatchJob, python: str) -> str:
    """An sbatch script that runs SCRIPT ARGS with torchrun on every node of the job."""
    nproc = job.nproc_per_node or job.gpus_per_node or 1
    torchrun = [
        '"$PYTHON" -m torch.distributed.run',
        '--nnodes "$SLURM_NNODES"',
        f"--nproc-per-node {nproc}",
        "--rdzv-backend c10d",
        f'--rdzv-endpoint "$head:{RENDEZVOUS_PORT}"',
        '--rdzv-id "$SLURM_JOB_ID"',
        f"--max-restarts {job.max_restarts}",
        " ".join(shlex.quote(word) for word in [script, *script_args]),
    ]
    lines = [
        "#!/bin/bash",
        *_sbatch_header(script, job),
        "",
        "# One task per node runs torchrun; torchrun starts the node's processes, and all",
        "# of them meet at the first node of the job (c10d rendezvous, the job id as its id).",
        "# Written by `accelmigrate run --slurm-script`; submit it with `sbatch` from the",
        "# directory the script's path is relative to.",
        "set -euo pipefail",
        "",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        f"PYTHON=${{PYTHON:-{shlex.quote(python)}}}",
        *(["export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK  # srun does not inherit it"] if job.cpus_per_task else []),
        "",
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\\n    " + " \\\n    ".join(torchrun),
        "",
    ]
    return "\n".join(lines)


def _sbatch_header(script: str, job: BatchJob) -> list[str]:
    options = [
        ("job-name", job.job_name if job.job_name is not None else default_job_name(script)),
        ("nodes", job.nodes),
        ("ntasks-per-node", 1),
        ("gpus-per-node", job.gpus_per_node or None),
        ("cpus-per-task", job.cpus_per_task),
        ("time", job.time),
        ("partition", job.partition),
        ("account", job.account),
        ("output", "%x-%j.out"),
    ]
    header = []
    for key, value in options:
        if value is None:
            continue
        if not str(value) or any(char.isspace() for char in str(value)):
            raise SlurmError(f"--{key} {value!r}: an sbatch option value cannot be empty or hold spaces")
        header.append(f"#SBATCH --{key}={value}")
    return header


_NOT_IN_JOB_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def default_job_name(script: str) -> str:
    """The script's file name without its suffix, as a job name that an
    `#SBATCH` line and the `%x` of the output file take as it is: every run
    of other characters (spaces, quotes, `%`) becomes one `_`."""
    name = _NOT_IN_JOB_NAME.sub("_", PurePath(script).stem).strip("_")
    return name or "train"
