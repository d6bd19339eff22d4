"""`accelmigrate run`: launch a script on one or many processes through torchrun.

    accelmigrate run train.py --nproc-per-node 4 -- --lr 0.1
    accelmigrate run train.py --nnodes 2 --rdzv-endpoint node01:29500   # on each node
    accelmigrate run --slurm-script job.sbatch --nodes 2 --gpus-per-node 4 train.py -- --lr 0.1

The launcher is torchrun itself (`torch.distributed.run`, called in this
process): `torchrun_args` only builds its argument list.

On one machine nothing the launch opens listens beyond the loopback
interface. torch's TCPStore listens on every interface whatever host it is
given, and torchrun's own rendezvous starts such stores (c10d two, static
one); so a one-node launch uses `LoopbackRendezvous` instead (registered
with torchrun as `LOOPBACK_RENDEZVOUS`): one store, bound to 127.0.0.1 at a
port picked when it binds (two launches never race for a port), which the
ranks also use as MASTER_ADDR:MASTER_PORT. The ranks' collectives listen
where GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME say, which a one-node launch
sets to the loopback interface unless they are set already (gloo otherwise
listens on the address of the host's name, NCCL on the first network
interface).

Each process runs the script through this module's `__main__` block
(`torchrun --module accelmigrate.launch.runner SCRIPT ARGS`), which behaves like
`python SCRIPT ARGS` and, when the script raises, writes torchrun's error file
(`TORCHELASTIC_ERROR_FILE`): the launcher then knows which rank failed, with
which exit code and traceback, and prints it at the end, after the processes'
own output.

`--nproc-per-node auto` (the default) starts one process per GPU (per
accelerator device), and one process on a machine without any: several
processes on the same CPU cores only share them.

Before launching, the script's source is read (never imported) to see
whether it joins a process group (`process_group`): several processes of a
script that does not would each train a full copy on their own, so such a
launch is refused unless `--force`, and a one-process launch warns.

Torch is imported only when a launch happens, never to build arguments; without
torch installed, `run` stops at once with one line that names the install
command (writing an sbatch script needs no torch here).
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import runpy
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import click

from accelmigrate.launch import slurm
from accelmigrate.launch.frameworks import tell_frameworks
from accelmigrate.launch.process_group import initialises_process_group, module_entry_file, pythonpath_folders
from accelmigrate.launch.torch_check import require_torch

RANK_ENTRY = "accelmigrate.launch.runner"
MODULE_FLAG = "-m"  # what a rank is given in place of SCRIPT for `run -m MODULE`
LOOPBACK = "127.0.0.1"
LOCAL_ENDPOINT = f"{LOOPBACK}:0"  # the port is picked when the store binds
LOOPBACK_RENDEZVOUS = "accelmigrate-loopback"
LOOPBACK_INTERFACES = ("lo", "lo0")  # Linux, macOS and the BSDs
COLLECTIVES_INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_PRECISE_TIME = "accelmigrate_time_ns"
_SIGNAL_HINTS = {
    "SIGKILL": " (often the kernel's out-of-memory killer)",
    "SIGTERM": " (torchrun stops the other ranks once one has failed)",
}


class LaunchError(ValueError):
    """The options do not describe a launch torchrun can make."""


# --- what the script does with the processes ------------------------------------------


def check_process_group(script: str, processes: int, force: bool, as_module: bool = False) -> None:
    """A script that never joins a process group, launched N times, is N
    independent copies each doing the whole job: refused when N > 1 (unless
    `force`), a warning otherwise. A module run with `-m` imports from the
    current folder too."""
    search = [Path.cwd(), *pythonpath_folders()] if as_module else None
    if force or initialises_process_group(Path(script), search) is not False:
        return
    found_nowhere = (
        f"{script} never initialises a process group (no init_process_group, init_distributed, "
        "Lightning, Accelerate or DeepSpeed found in it or in the modules beside it that it imports)"
    )
    migrate = f"accelmigrate apply {script} --to ddp"
    if processes > 1:
        raise LaunchError(
            f"{found_nowhere}: its {processes} processes would each train a full, separate copy. "
            f"Migrate it first ({migrate}), or pass --force to launch them anyway"
        )
    click.echo(
        f"accelmigrate run: warning: {found_nowhere}; it runs as one plain process. "
        f"To train on several processes, migrate it first: {migrate}",
        err=True,
    )


# --- arguments ---------------------------------------------------------------------


def torchrun_args(
    script: str,
    script_args: Sequence[str] = (),
    *,
    nproc_per_node: int,
    nnodes: str = "1",
    node_rank: Optional[int] = None,
    rdzv_endpoint: Optional[str] = None,
    rdzv_id: Optional[str] = None,
    max_restarts: int = 0,
    entry_module: Optional[str] = RANK_ENTRY,
) -> list[str]:
    """The argument list for `torch.distributed.run` (torchrun).

    One node without an endpoint: `LoopbackRendezvous`, which `launch`
    registers with torchrun (the list is for `launch`, not a torchrun command).
    Several nodes: c10d rendezvous at `rdzv_endpoint` (the first node), or,
    when `node_rank` is given, torchrun's static rendezvous with `rdzv_endpoint`
    as the address of node 0 and this node's fixed rank.
    """
    if nproc_per_node < 1:
        raise LaunchError(f"--nproc-per-node must be at least 1, not {nproc_per_node}")
    max_nodes = _max_nodes(nnodes)
    args = ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node)]
    if rdzv_endpoint is None:
        if max_nodes > 1:
            raise LaunchError("a launch on several nodes needs --rdzv-endpoint HOST:PORT (the first node's address)")
        if node_rank not in (None, 0):
            raise LaunchError(f"--node-rank {node_rank} on a single node: only rank 0 exists")
        args += ["--rdzv-backend", LOOPBACK_RENDEZVOUS, "--rdzv-endpoint", LOCAL_ENDPOINT]
        args += ["--rdzv-id", rdzv_id or "local"]
    elif node_rank is not None:
        if not 0 <= node_rank < max_nodes:
            raise LaunchError(f"--node-rank {node_rank} is outside 0..{max_nodes - 1}")
        args += ["--rdzv-backend", "static", "--rdzv-endpoint", rdzv_endpoint, "--node-rank", str(node_rank)]
    else:
        args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id or "accelmigrate"]
    args += ["--max-restarts", str(max_restarts)]
    if entry_module:
        args += ["--module", entry_module]
    return args + [script, *script_args]


def _max_nodes(nnodes: str) -> int:
    """torchrun's `N` or elastic `MIN:MAX`."""
    parts = str(nnodes).split(":")
    try:
        bounds = [int(part) for part in parts]
    except ValueError:
        bounds = []
    if len(bounds) not in (1, 2) or min(bounds) < 1 or bounds[0] > bounds[-1]:
        raise LaunchError(f"--nnodes {nnodes!r}: expected N or MIN:MAX")
    return bounds[-1]


def processes_per_node(spec: str) -> int:
    """`auto`: one per accelerator device (GPU), else 1; or the number given."""
    if spec != "auto":
        try:
            return int(spec)
        except ValueError:
            raise LaunchError(f"--nproc-per-node {spec!r}: expected a number or `auto`") from None
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        return max(1, accelerator.device_count())
    if torch.cuda.is_available():
        return max(1, torch.cuda.device_count())
    return 1


# --- launching and reporting -----------------------------------------------------


def launch(argv: Sequence[str]) -> int:
    """Run torchrun in this process; the exit code for `accelmigrate run`."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(list(argv))
    if args.rdzv_backend == LOOPBACK_RENDEZVOUS:
        register_loopback_rendezvous()
        keep_collectives_on_loopback(os.environ)
    try:
        run(args)
    except ChildFailedError as error:
        root_rank = first_failure(error.failures)
        report_failures(error.failures, root_rank, several_nodes=_max_nodes(args.nnodes) > 1)
        return exit_code_of(error.failures[root_rank].exitcode)
    except SignalException as error:
        click.echo(f"accelmigrate run: stopped by {error.sigval.name}", err=True)
        return 128 + int(error.sigval)
    return 0


# --- a launch on this machine alone: loopback only --------------------------------------


class LoopbackRendezvous:
    """torchrun's rendezvous (its RendezvousHandler interface) for a launch on
    this machine alone: one node, rank 0, and one store listening on
    127.0.0.1, which the ranks reach as MASTER_ADDR:MASTER_PORT."""

    def __init__(self, run_id: str, timeout_s: int) -> None:
        self._run_id = run_id
        self._timeout_s = timeout_s
        self._store = None  # the current round's, kept alive while its ranks run

    def get_backend(self) -> str:
        return LOOPBACK_RENDEZVOUS

    @property
    def use_agent_store(self) -> bool:
        return True  # the ranks' init_process_group uses this store, not one of their own

    def next_rendezvous(self):
        from torch.distributed import PrefixStore
        from torch.distributed.elastic.rendezvous import RendezvousInfo, RendezvousStoreInfo

        # A new store for every round: the ranks of a restart then never read
        # the keys (gloo's peer addresses) of the ranks they replace.
        self._store = loopback_store(self._timeout_s)
        return RendezvousInfo(
            PrefixStore(self._run_id, self._store), 0, 1, RendezvousStoreInfo(LOOPBACK, self._store.port)
        )

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self._run_id

    def shutdown(self) -> bool:
        return True


def _create_loopback_rendezvous(params) -> LoopbackRendezvous:
    return LoopbackRendezvous(params.run_id, params.get_as_int("timeout", 600))


def register_loopback_rendezvous() -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(LOOPBACK_RENDEZVOUS, _create_loopback_rendezvous)


def loopback_store(timeout_s: int):
    """A TCPStore server listening on 127.0.0.1 only, at a free port: given
    a host, TCPStore still listens on every interface, but it listens on a
    socket it is handed as it is bound."""
    from torch.distributed import TCPStore

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((LOOPBACK, 0))
        listener.listen()
    except OSError:
        listener.close()
        raise
    port = listener.getsockname()[1]
    return TCPStore(
        LOOPBACK,
        port,
        is_master=True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
        master_listen_fd=listener.detach(),  # the store closes it when it ends
    )


def keep_collectives_on_loopback(environ) -> None:
    """Point gloo and NCCL at the loopback interface, unless the user chose
    an interface: each rank listens there for its peers, which on one machine
    are all local."""
    interface = loopback_interface()
    if interface is not None:
        for name in COLLECTIVES_INTERFACE_VARIABLES:
            environ.setdefault(name, interface)


def loopback_interface() -> Optional[str]:
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:  # no interfaces to list (a sandbox)
        return None
    return next((name for name in LOOPBACK_INTERFACES if name in names), None)


def first_failure(failures: Mapping[int, Any]) -> int:
    """The rank that failed first. torchrun's own choice compares timestamps in
    whole seconds, so a rank that merely lost its peer often ties with the one
    that raised; the error files written by `run_rank` carry nanoseconds."""

    def when(rank: int):
        failure = failures[rank]
        message = failure.message if isinstance(failure.message, dict) else {}
        precise = message.get("extraInfo", {}).get(_PRECISE_TIME)
        # a rank without a traceback (a signal) is rarely the cause: after those with one
        return (precise is None, int(precise or 0), failure.timestamp, rank)

    return min(failures, key=when)


def exit_code_of(process_exit_code: int) -> int:
    """A shell's convention: a process killed by signal N gives 128 + N."""
    if process_exit_code > 0:
        return process_exit_code
    if process_exit_code < 0:
        return 128 - process_exit_code
    return 1


def report_failures(failures: Mapping[int, Any], root_rank: int, several_nodes: bool = False) -> None:
    """Print which rank failed first, with its exit code and traceback, then the
    others (usually the ranks torchrun stopped once the first one failed)."""
    from rich.console import Console
    from rich.text import Text

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    root = failures[root_rank]
    host = socket.gethostname()
    console.print()
    console.print(
        Text(
            f"rank {root_rank} failed first (local rank {root.local_rank} on {host}): {_exit_text(root)}",
            style="bold red",
        )
    )
    console.print(Text(_traceback_text(root)))
    for rank, failure in sorted(failures.items()):
        if rank != root_rank:
            console.print(Text(f"rank {rank} also ended ({_exit_text(failure)}):", style="red"), end=" ")
            console.print(Text(_exception_text(failure)))
    if several_nodes:
        console.print("(each node sees only its own ranks: the cause may be in another node's output)")


def _exit_text(failure: Any) -> str:
    text = f"exit code {failure.exitcode}"
    if failure.exitcode < 0:
        text += f", {failure.signal_name()}"
    return text


def _exception_text(failure: Any) -> str:
    """What a rank that did not fail first raised, all of it (a message of
    several lines, notes), without the traceback the first rank already shows;
    for a rank without an exception, what torchrun knows."""
    message = failure.message
    if isinstance(message, dict) and message.get("message"):
        return str(message["message"]).rstrip("\n")
    return _traceback_text(failure).strip()


def _traceback_text(failure: Any) -> str:
    """The traceback the rank wrote to its error file, or what torchrun knows."""
    message = failure.message
    if isinstance(message, dict):
        extra = message.get("extraInfo", {})
        return str(extra.get("py_callstack") or message.get("message") or "")
    if failure.exitcode < 0:
        return f"killed by {failure.signal_name()}" + _SIGNAL_HINTS.get(failure.signal_name(), "")
    return "no Python traceback: the process exited without raising (sys.exit or a crash); see its output above"


# --- one rank --------------------------------------------------------------------


def run_rank(script: str, script_args: Sequence[str]) -> None:
    """Run SCRIPT as `python SCRIPT ARGS` would (or, where SCRIPT is `-m`,
    the module named first in ARGS, as `python -m MODULE ARGS` would), inside
    a process torchrun started.

    When the script raises, its traceback (from the script's own frame on) goes
    to the error file torchrun reads and to stderr, prefixed by the rank as
    torch.distributed prints it, and the process exits with code 1.
    """
    faulthandler.enable(all_threads=True)  # what torchrun's error handler does for a crash
    if script == MODULE_FLAG:
        module, *script_args = script_args
        path = str(module_entry_file(module) or module)
        sys.argv = [path, *script_args]
        sys.path[0] = os.getcwd()  # as for `python -m`: the current folder
        run = functools.partial(runpy.run_module, module, run_name="__main__", alter_sys=True)
    else:
        path = os.path.abspath(script)
        sys.argv = [script, *script_args]
        sys.path[0] = os.path.dirname(path)  # as for `python SCRIPT`: the script's folder, not ours
        run = functools.partial(runpy.run_path, path, run_name="__main__")
    try:
        run()
    except Exception as error:  # SystemExit and KeyboardInterrupt keep their usual meaning
        error.__traceback__ = _from_frame_of(path, error.__traceback__)
        _write_error_file(error)
        _print_with_rank(traceback.format_exception(error))
        # Not sys.exit: tearing the interpreter down with a process group still
        # up can abort in gloo's threads (SIGABRT) and hide the real exit code.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    # A group the script left up (Lightning Fabric's is left to its exit
    # handler) is left here, the way that avoids gloo's abort at exit.
    from accelmigrate.runtime.distributed import destroy_distributed

    destroy_distributed()


def _write_error_file(error: BaseException) -> None:
    """torchrun's error file, in the shape its ErrorHandler writes, plus the
    time in nanoseconds (see `first_failure`)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    now = time.time_ns()
    data = {
        "message": {
            "message": "".join(traceback.format_exception_only(error)).rstrip("\n"),
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(error)),
                "timestamp": str(now // 1_000_000_000),
                _PRECISE_TIME: str(now),
            },
        }
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle)


def _from_frame_of(path: str, tb):
    """Drop the launcher's own frames (this module, runpy) from a traceback."""
    start = tb
    while start is not None and os.path.abspath(start.tb_frame.f_code.co_filename) != path:
        start = start.tb_next
    return start


def _print_with_rank(lines: Sequence[str]) -> None:
    prefix = f"[rank{os.environ.get('RANK', '?')}]: "
    text = "".join(lines)
    sys.stderr.write("".join(prefix + line + "\n" for line in text.rstrip("\n").split("\n")))
    sys.stderr.flush()


# --- the command -----------------------------------------------------------------


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "help_option_names": ["-h", "--help"]},
)
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "-m", "--module", "module", metavar="MODULE", default=None,
    help="Run a module as `python -m MODULE` does (from the current folder), instead of SCRIPT.",
)
@click.option(
    "--nproc-per-node",
    default="auto",
    show_default=True,
    help="Processes on this node: a number, or `auto` (one per GPU, 1 without).",
)
@click.option("--nnodes", default=None, help="Nodes in the launch: N or MIN:MAX (default 1, or SLURM's step nodes).")
@click.option(
    "--node-rank", type=int, default=None, help="This node's fixed rank (static rendezvous at --rdzv-endpoint)."
)
@click.option(
    "--rdzv-endpoint", default=None, metavar="HOST:PORT", help="Where the nodes meet: the first node's address."
)
@click.option("--rdzv-id", default=None, help="Rendezvous id shared by all nodes of one launch.")
@click.option(
    "--max-restarts", type=int, default=0, show_default=True, help="Restarts of the whole group after a failure."
)
@click.option(
    "--slurm-script",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write an sbatch script for SCRIPT instead of launching.",
)
@click.option("--nodes", type=int, default=None, help="[--slurm-script] nodes to ask for (default --nnodes, else 1).")
@click.option(
    "--gpus-per-node",
    type=int,
    default=None,
    help="[--slurm-script] GPUs per node (default --nproc-per-node, else 1; 0: none).",
)
@click.option("--time", "time_limit", default=None, help="[--slurm-script] time limit, e.g. 04:00:00.")
@click.option("--partition", default=None, help="[--slurm-script] partition.")
@click.option("--account", default=None, help="[--slurm-script] account.")
@click.option("--job-name", default=None, help="[--slurm-script] job name (default: the script's name).")
@click.option("--cpus-per-task", type=int, default=None, help="[--slurm-script] CPUs for each node's task.")
@click.option(
    "--force",
    is_flag=True,
    help="Launch several processes even of a script that never initialises a process group.",
)
def run_command(
    script,
    script_args,
    module,
    nproc_per_node,
    nnodes,
    node_rank,
    rdzv_endpoint,
    rdzv_id,
    max_restarts,
    slurm_script,
    nodes,
    gpus_per_node,
    time_limit,
    partition,
    account,
    job_name,
    cpus_per_task,
    force,
):
    """Launch SCRIPT on one or many processes through torchrun.

    Options go before `--`; everything after it goes to the script. Inside a
    SLURM allocation of several nodes, start it once per node
    (`srun --ntasks-per-node=1 accelmigrate run ...`): the number of nodes and
    the rendezvous come from SLURM's environment. `-m MODULE` runs a module
    of the current folder's packages as `python -m` does; then every
    argument goes to it.
    """
    entry, script_args, source = _entry(script, script_args, module)
    script = entry
    try:
        if slurm_script:
            job = slurm.BatchJob(
                nodes=nodes or (_max_nodes(nnodes) if nnodes else 1),
                gpus_per_node=gpus_per_node if gpus_per_node is not None else _number_or(nproc_per_node, 1),
                nproc_per_node=_number_or(nproc_per_node, None),
                time=time_limit,
                partition=partition,
                account=account,
                job_name=job_name if job_name is not None or module is None else module.rsplit(".", 1)[-1],
                cpus_per_task=cpus_per_task,
                max_restarts=max_restarts,
            )
            check_process_group(source, job.nodes * (job.nproc_per_node or job.gpus_per_node or 1), force, module is not None)
            _write_sbatch(slurm_script, slurm.sbatch_script(script, script_args, job, sys.executable))
            return
        _reject_batch_only_options(
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            time=time_limit,
            partition=partition,
            account=account,
            job_name=job_name,
            cpus_per_task=cpus_per_task,
        )
        require_torch("run")
        if nnodes is None and rdzv_endpoint is None:
            placement = slurm.placement_from_env(os.environ)
            if placement:
                nnodes, rdzv_endpoint, rdzv_id = (
                    str(placement.nnodes),
                    placement.rdzv_endpoint,
                    rdzv_id or placement.rdzv_id,
                )
        processes = processes_per_node(nproc_per_node)
        argv = torchrun_args(
            script,
            script_args,
            nproc_per_node=processes,
            nnodes=nnodes or "1",
            node_rank=node_rank,
            rdzv_endpoint=rdzv_endpoint,
            rdzv_id=rdzv_id,
            max_restarts=max_restarts,
        )
        check_process_group(source, processes * _max_nodes(nnodes or "1"), force, module is not None)
        import torch

        tell_frameworks(os.environ, processes, _max_nodes(nnodes or "1"), torch.cuda.is_available())
    except (LaunchError, slurm.SlurmError) as error:
        raise click.UsageError(str(error)) from None
    sys.exit(launch(argv))


def _entry(script: Optional[str], script_args: Sequence[str], module: Optional[str]) -> tuple[str, tuple, str]:
    """What each rank runs (SCRIPT, or `-m MODULE`), the arguments it is
    given, and the file whose source says whether it joins a process group."""
    if module is None:
        if script is None:
            raise click.UsageError("Missing argument 'SCRIPT' (or -m MODULE).")
        if not os.path.isfile(script):
            raise click.BadParameter(f"{script!r} is no file.", param_hint="'SCRIPT'")
        return script, tuple(script_args), script
    found = module_entry_file(module)
    if found is None:
        raise click.BadParameter(f"no module {module!r} in the current folder or on PYTHONPATH", param_hint="'-m'")
    return MODULE_FLAG, (module, *((script,) if script is not None else ()), *script_args), str(found)


def _number_or(spec: str, default):
    return int(spec) if str(spec).isdigit() else default


def _reject_batch_only_options(**given) -> None:
    used = [name.replace("_", "-") for name, value in given.items() if value is not None]
    if used:
        raise LaunchError(f"--{', --'.join(used)}: only with --slurm-script (they describe the batch job)")


def _write_sbatch(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, 0o755)
    click.echo(f"wrote {path}; submit it with: sbatch {path}")


if __name__ == "__main__":
    # torchrun --module accelmigrate.launch.runner SCRIPT ARGS: one rank of a launch.
    if len(sys.argv) < 2:
        sys.exit("usage: python -m accelmigrate.launch.runner SCRIPT [ARGS...] (started by `accelmigrate run`)")
    run_rank(sys.argv[1], sys.argv[2:])
