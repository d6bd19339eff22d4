"""`accelmigrate run`: torchrun's arguments, SLURM, and a failing rank reported clearly.

The launches (two, a few seconds each) use real gloo process groups on the CPU.
"""

import ipaddress
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from accelmigrate.launch import slurm
from accelmigrate.launch.process_group import initialises_process_group
from accelmigrate.launch.runner import (
    LOOPBACK_RENDEZVOUS,
    LaunchError,
    exit_code_of,
    first_failure,
    keep_collectives_on_loopback,
    loopback_interface,
    report_failures,
    torchrun_args,
)

from conftest import ROOT, SCRIPTS, run_cli

FAILING_RANK = SCRIPTS / "failing_rank.py"
LISTENING_SOCKETS = SCRIPTS / "runner_listening_sockets.py"


# --- torchrun's arguments -----------------------------------------------------------


def test_one_node_meets_on_loopback_at_a_port_the_store_picks():
    assert torchrun_args("train.py", ["--lr", "0.1"], nproc_per_node=2) == [
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        LOOPBACK_RENDEZVOUS,
        "--rdzv-endpoint",
        "127.0.0.1:0",
        "--rdzv-id",
        "local",
        "--max-restarts",
        "0",
        "--module",
        "accelmigrate.launch.runner",
        "train.py",
        "--lr",
        "0.1",
    ]


def test_several_nodes_meet_at_the_endpoint_with_c10d():
    args = torchrun_args(
        "train.py", nproc_per_node=4, nnodes="2", rdzv_endpoint="node01:29500", rdzv_id="job7", max_restarts=3
    )
    assert args[:12] == [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "4",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "node01:29500",
        "--rdzv-id",
        "job7",
        "--max-restarts",
        "3",
    ]


def test_a_fixed_node_rank_uses_the_static_rendezvous():
    args = torchrun_args("train.py", nproc_per_node=8, nnodes="2", node_rank=1, rdzv_endpoint="10.0.0.1:29500")
    assert "--rdzv-backend static --rdzv-endpoint 10.0.0.1:29500 --node-rank 1" in " ".join(args)


def test_the_script_can_run_without_the_rank_wrapper():
    assert torchrun_args("train.py", ["-x"], nproc_per_node=1, entry_module=None)[-2:] == ["train.py", "-x"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nnodes": "2"}, "--rdzv-endpoint"),
        ({"nnodes": "1:4"}, "--rdzv-endpoint"),
        ({"node_rank": 1}, "only rank 0"),
        ({"nnodes": "2", "node_rank": 2, "rdzv_endpoint": "h:1"}, "outside 0..1"),
        ({"nnodes": "two"}, "N or MIN:MAX"),
        ({"nnodes": "4:2", "rdzv_endpoint": "h:1"}, "N or MIN:MAX"),
        ({"nproc_per_node": 0}, "at least 1"),
    ],
)
def test_impossible_launches_are_refused(kwargs, message):
    options = {"nproc_per_node": 2, **kwargs}
    with pytest.raises(LaunchError, match=message):
        torchrun_args("train.py", **options)


def test_torchrun_itself_accepts_the_arguments():
    from torch.distributed.run import parse_args

    args = parse_args(torchrun_args("train.py", ["--epochs", "1"], nproc_per_node=2, nnodes="1"))
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.rdzv_endpoint) == (
        "1",
        "2",
        LOOPBACK_RENDEZVOUS,
        "127.0.0.1:0",
    )
    assert args.module and args.training_script == "accelmigrate.launch.runner"
    assert args.training_script_args == ["train.py", "--epochs", "1"]


def test_collectives_are_pointed_at_loopback_unless_the_user_chose():
    interface = loopback_interface()
    if interface is None:
        pytest.skip("no loopback interface to name")
    environ = {"NCCL_SOCKET_IFNAME": "ib0"}
    keep_collectives_on_loopback(environ)
    assert environ == {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": "ib0"}


def test_exit_code_follows_the_shell_convention_for_signals():
    assert (exit_code_of(3), exit_code_of(-9), exit_code_of(0)) == (3, 137, 1)


# --- one rank: the error file torchrun reads --------------------------------------------


def test_a_rank_writes_its_traceback_where_torchrun_reads_it(tmp_path):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    script = tmp_path / "crash.py"
    script.write_text("def load():\n    raise KeyError('missing column')\n\nload()\n")
    error_file = tmp_path / "error.json"
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file), "RANK": "3"}
    done = subprocess.run(
        [sys.executable, "-m", "accelmigrate.launch.runner", str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "[rank3]: KeyError: 'missing column'" in done.stderr

    failure = ProcessFailure(local_rank=3, pid=1, exitcode=1, error_file=str(error_file))
    callstack = failure.message["extraInfo"]["py_callstack"]
    assert callstack.startswith("Traceback (most recent call last):")
    assert f'File "{script}", line 4, in <module>' in callstack and "in load" in callstack
    assert "runpy" not in callstack and "accelmigrate" not in callstack  # the launcher's frames are dropped

    # a rank that only lost its peer a little later is not taken for the cause
    # (torchrun's own timestamps, in whole seconds, tie here)
    first_ns = int(failure.message["extraInfo"]["accelmigrate_time_ns"])
    later = ProcessFailure(local_rank=0, pid=2, exitcode=1, error_file=str(error_file))
    later.message["extraInfo"]["accelmigrate_time_ns"] = str(first_ns + 1)
    assert first_failure({0: later, 3: failure}) == 3


def _rank_error_file(tmp_path, rank: int, body: str):
    """The error file a real rank writes when SCRIPT raises; its ProcessFailure."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    script = tmp_path / f"rank{rank}.py"
    script.write_text(body)
    error_file = tmp_path / f"error{rank}.json"
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file), "RANK": str(rank)}
    done = subprocess.run([sys.executable, "-m", "accelmigrate.launch.runner", str(script)], capture_output=True, env=env)
    assert done.returncode == 1
    return ProcessFailure(local_rank=rank, pid=rank + 100, exitcode=1, error_file=str(error_file))


def test_every_failing_rank_keeps_its_whole_exception(tmp_path, capsys):
    first = _rank_error_file(tmp_path, 1, "raise ValueError('shapes differ:\\n  input (8, 3)\\n  target (8, 4)')\n")
    second = _rank_error_file(
        tmp_path,
        0,
        "error = RuntimeError('NCCL timeout\\nwaited 600 s for rank 1')\n"
        "error.add_note('collective: all_reduce')\n"
        "raise error\n",
    )
    report_failures({0: second, 1: first}, root_rank=1)
    summary = capsys.readouterr().err
    assert "rank 1 failed first" in summary
    assert "ValueError: shapes differ:\n  input (8, 3)\n  target (8, 4)" in summary
    also = summary[summary.index("rank 0 also ended (exit code 1):") :]
    assert "RuntimeError: NCCL timeout\nwaited 600 s for rank 1\ncollective: all_reduce" in also


# --- a script that never joins a process group -------------------------------------------

PLAIN_SCRIPT = """\
import pathlib, sys
import torch

model = torch.nn.Linear(4, 1)
pathlib.Path(sys.argv[1]).joinpath(f"copy-{__import__('os').environ.get('RANK')}").write_text("trained")
"""


@pytest.mark.parametrize("word", ["ddp", "fsdp", "accelerate", "fabric"])
def test_what_each_distributed_word_writes_is_seen_to_join_a_group(tmp_path, word):
    """`run` launches every word's output without --force (Fabric's imports
    `lightning_fabric`, once read as no framework)."""
    from accelmigrate.engine.migrate import migrate_source

    script = tmp_path / "train.py"
    result = migrate_source((SCRIPTS / "ddp_plain_flat.py").read_text(), [(word, {})], "train.py")
    assert result.code != (SCRIPTS / "ddp_plain_flat.py").read_text(), word
    script.write_text(result.code)
    assert initialises_process_group(script, search_path=[]) is True


@pytest.mark.parametrize(
    "source",
    [
        "import torch.distributed as dist\ndist.init_process_group('gloo')\n",
        "import torch\ntorch.distributed.init_process_group(backend='nccl')\n",
        "from torch.distributed import init_process_group as start\nstart('gloo')\n",
        "from torch.distributed.device_mesh import init_device_mesh\nmesh = init_device_mesh('cuda', (8,))\n",
        "from accelmigrate.runtime.distributed import init_distributed\ninit_distributed()\n",
        "from accelmigrate.runtime.distributed import *\nwith distributed_session():\n    pass\n",
        "def setup(backend_module):\n    backend_module.init_process_group('gloo')\n",
        "import lightning as L\ntrainer = L.Trainer(devices=4)\n",
        "from accelerate import Accelerator\naccelerator = Accelerator()\n",
        "from transformers import Trainer\nTrainer(model=None)\n",
    ],
)
def test_the_ways_a_script_joins_a_process_group_are_seen(tmp_path, source):
    script = tmp_path / "train.py"
    script.write_text(source)
    assert initialises_process_group(script, search_path=[]) is True


@pytest.mark.parametrize(
    "source",
    [
        PLAIN_SCRIPT,
        "import torch\n# dist.init_process_group('gloo') once we have GPUs\nnote = 'call init_process_group first'\n",
        "from transformers import AutoTokenizer\ntokenizer = AutoTokenizer.from_pretrained('x')\n",
        "import torch.distributed as dist\nprint(dist.is_available())\n",
    ],
)
def test_a_script_that_never_joins_one_is_told_apart(tmp_path, source):
    script = tmp_path / "train.py"
    script.write_text(source)
    assert initialises_process_group(script, search_path=[]) is False


def test_the_process_group_may_be_set_up_in_a_module_beside_the_script(tmp_path):
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text("")
    (tmp_path / "utils" / "dist.py").write_text(
        "import torch.distributed as dist\ndef setup():\n    dist.init_process_group('gloo')\n"
    )
    script = tmp_path / "train.py"
    script.write_text("from utils.dist import setup\nsetup()\n")
    assert initialises_process_group(script, search_path=[]) is True
    (tmp_path / "utils" / "dist.py").write_text("def setup():\n    pass\n")
    assert initialises_process_group(script, search_path=[]) is False


def test_a_script_that_does_not_parse_is_left_to_python(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("def broken(:\n")
    assert initialises_process_group(script) is None


def test_several_copies_of_a_script_without_a_process_group_are_refused(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLAIN_SCRIPT)
    done = run_cli("run", "--nproc-per-node", "2", str(script), "--", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "never initialises a process group" in done.stderr
    assert f"accelmigrate apply {script} --to ddp" in done.stderr and "--force" in done.stderr
    assert not list(tmp_path.glob("copy-*"))  # nothing was launched


def test_an_sbatch_script_for_several_copies_is_refused_too(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLAIN_SCRIPT)
    batch = tmp_path / "job.sbatch"
    done = run_cli("run", "--slurm-script", str(batch), "--nodes", "2", str(script))
    assert done.returncode == 2 and "never initialises a process group" in done.stderr
    assert not batch.exists()
    done = run_cli("run", "--slurm-script", str(batch), "--nodes", "2", "--force", str(script))
    assert done.returncode == 0, done.stderr
    assert batch.exists()


@pytest.mark.slow
def test_one_process_of_such_a_script_runs_with_a_warning(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLAIN_SCRIPT)
    done = run_cli("run", "--nproc-per-node", "1", str(script), "--", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "warning: " in done.stderr and "never initialises a process group" in done.stderr
    assert "--to ddp" in done.stderr
    assert [path.name for path in tmp_path.glob("copy-*")] == ["copy-0"]


@pytest.mark.slow
def test_force_launches_the_copies_anyway(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLAIN_SCRIPT)
    done = run_cli("run", "--nproc-per-node", "2", "--force", str(script), "--", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in tmp_path.glob("copy-*")) == ["copy-0", "copy-1"]


# --- without torch -------------------------------------------------------------------

# What an environment without torch looks like to `import torch` and to importlib.
WITHOUT_TORCH = "import sys, runpy; sys.modules['torch'] = None; sys.argv[0] = 'accelmigrate'; "
WITHOUT_TORCH += "runpy.run_module('accelmigrate', run_name='__main__')"


def run_cli_without_torch(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.mark.parametrize("command", ["run", "profile"])
def test_commands_that_run_scripts_name_the_install_when_torch_is_missing(command):
    done = run_cli_without_torch(command, str(FAILING_RANK))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr  # one line, no traceback
    assert f"accelmigrate {command}: torch is not installed" in done.stderr
    assert "pip install 'accelmigrate[torch]'" in done.stderr


LOADER_SCRIPT = """\
import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        x = torch.tensor([float(open(f"squares/{index}.txt").read())])  # each item read from its own file
        return x, x**2


def main():
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for inputs, targets in DataLoader(Squares(), batch_size=8, shuffle=True):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


def test_the_tool_side_works_without_torch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(LOADER_SCRIPT)
    checked = run_cli_without_torch("check", str(script), "--to", "workers")
    assert checked.returncode == 1 and f"{script}:17:" in checked.stdout, checked.stdout + checked.stderr
    applied = run_cli_without_torch("apply", str(script), "--to", "workers", cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    assert "num_workers=" in script.read_text()
    assert run_cli_without_torch("check", str(script), "--to", "workers").returncode == 0


# --- SLURM ------------------------------------------------------------------------


def test_expand_hostlist():
    assert slurm.expand_hostlist("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07", "gpu5"]
    assert slurm.expand_hostlist("r[1-2]-n[8-9]") == ["r1-n8", "r1-n9", "r2-n8", "r2-n9"]
    assert slurm.expand_hostlist("single") == ["single"]


def _slurm_step(nodes, tasks, **extra):
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NNODES": str(nodes),
        "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        **extra,
    }


def test_an_srun_step_with_one_task_per_node_gives_the_placement():
    placement = slurm.placement_from_env(_slurm_step(2, 2), first_host=lambda nodes: slurm.expand_hostlist(nodes)[0])
    assert placement == slurm.Placement(nnodes=2, rdzv_endpoint="gpu07:29500", rdzv_id="4242")


def test_outside_slurm_or_on_one_node_the_launch_stays_local():
    assert slurm.placement_from_env({}) is None
    assert slurm.placement_from_env(_slurm_step(1, 1)) is None
    assert slurm.placement_from_env({"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "1"}) is None


def test_a_multi_node_allocation_started_once_is_refused():
    batch_step = {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"}
    with pytest.raises(slurm.SlurmError, match="srun --ntasks-per-node=1"):
        slurm.placement_from_env(batch_step)
    with pytest.raises(slurm.SlurmError, match="one task per node"):
        slurm.placement_from_env(_slurm_step(2, 8))


def _fake_tool(folder: Path, name: str, body: str) -> None:
    tool = folder / name
    tool.write_text("#!/bin/sh\n" + body + "\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)


def test_the_sbatch_script_runs_torchrun_once_per_node(tmp_path):
    batch = tmp_path / "job.sbatch"
    done = run_cli(
        "run",
        "--slurm-script",
        str(batch),
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--time",
        "02:00:00",
        "--partition",
        "gpu",
        str(FAILING_RANK),
        "--",
        "--tag",
        "two words",
    )
    assert done.returncode == 0, done.stderr
    text = batch.read_text()
    assert subprocess.run(["bash", "-n", str(batch)], capture_output=True).returncode == 0
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --time=02:00:00",
        "#SBATCH --partition=gpu",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
    ):
        assert line in text.splitlines()

    # Run it with stand-ins for srun and scontrol: the torchrun line each node runs.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_tool(bin_dir, "scontrol", 'printf "gpu07\\ngpu08\\n"')
    _fake_tool(bin_dir, "srun", f'printf "%s\\n" "$@" > {shlex.quote(str(tmp_path / "srun.args"))}')
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON": "python3",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "4242",
    }
    assert subprocess.run(["bash", str(batch)], env=env, capture_output=True).returncode == 0
    srun_args = (tmp_path / "srun.args").read_text().splitlines()
    assert srun_args == [
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "python3",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "4",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "gpu07:29500",
        "--rdzv-id",
        "4242",
        "--max-restarts",
        "0",
        str(FAILING_RANK),
        "--tag",
        "two words",
    ]


def test_a_script_name_with_spaces_gives_a_usable_default_job_name(tmp_path):
    script = tmp_path / "my train (v2).py"
    shutil.copy(FAILING_RANK, script)
    batch = tmp_path / "job.sbatch"
    done = run_cli("run", "--slurm-script", str(batch), str(script))
    assert done.returncode == 0, done.stderr
    text = batch.read_text()
    assert "#SBATCH --job-name=my_train_v2" in text.splitlines()
    assert shlex.quote(str(script)) in text
    assert subprocess.run(["bash", "-n", str(batch)], capture_output=True).returncode == 0


@pytest.mark.parametrize("stem, name", [("train", "train"), ("a%b'c", "a_b_c"), ("résumé", "r_sum"), ("+++", "train")])
def test_default_job_names_hold_only_plain_characters(stem, name):
    assert slurm.default_job_name(f"/data/{stem}.py") == name


@pytest.mark.parametrize("given", ["my job", ""])
def test_a_job_name_the_user_gives_is_checked_not_changed(tmp_path, given):
    batch = tmp_path / "job.sbatch"
    done = run_cli("run", "--slurm-script", str(batch), "--job-name", given, str(FAILING_RANK))
    assert done.returncode == 2
    assert f"--job-name {given!r}: an sbatch option value cannot be empty or hold spaces" in done.stderr
    assert not batch.exists()


def test_batch_job_options_need_slurm_script():
    done = run_cli("run", "--nodes", "2", str(FAILING_RANK))
    assert done.returncode == 2
    assert "only with --slurm-script" in done.stderr


# --- launches ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_failing_rank_is_named_with_its_exit_code_and_traceback(tmp_path):
    done = run_cli("run", "--nproc-per-node", "2", str(FAILING_RANK), "--", "--tag", "hello", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "rank 1 of 2: sum=2 tag=hello" in done.stdout  # both ranks ran, with the script's arguments

    summary = done.stderr[done.stderr.index("rank 1 failed first") :]
    assert summary.splitlines()[0].endswith("exit code 1")
    assert "Traceback (most recent call last):" in summary
    assert "in check_batch" in summary and 'raise ValueError(f"bad batch on rank {rank}' in summary
    assert "ValueError: bad batch on rank 1: shapes do not match" in summary
    assert "runpy" not in summary
    assert "rank 0 also ended" in summary


@pytest.mark.slow
def test_a_successful_launch_runs_every_rank_like_python_would(tmp_path):
    done = run_cli("run", "--nproc-per-node", "2", str(FAILING_RANK), "--", "--fail-rank", "-1", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert f"rank {rank} of 2: sum=2 tag= argv0=failing_rank.py path0_is_script_dir=True" in done.stdout
    assert "failed" not in done.stderr


LEFT_UP = """\
import atexit
import os

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
atexit.register(lambda: print(f"rank {os.environ['RANK']} at exit: group {'up' if dist.is_initialized() else 'left'}"))
"""


@pytest.mark.slow
def test_a_group_the_script_leaves_up_is_left_before_the_interpreter_ends(tmp_path):
    """As Lightning Fabric's scripts do; gloo can abort a process that ends
    with its group up (conftest.TEARDOWN_ABORT)."""
    script = tmp_path / "left_up.py"
    script.write_text(LEFT_UP)
    done = run_cli("run", "--nproc-per-node", "2", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(line for line in done.stdout.splitlines() if "at exit" in line) == [
        "rank 0 at exit: group left",
        "rank 1 at exit: group left",
    ]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's /proc")
def test_a_one_node_launch_listens_on_loopback_only(tmp_path):
    """Every TCP socket that listens in the launch (the launcher's store, each
    rank's gloo pairs), seen from /proc by rank 0 once the ranks are connected."""
    done = run_cli("run", "--nproc-per-node", "2", str(LISTENING_SOCKETS), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "processes: 3" in lines  # the launcher and its two ranks
    addresses = [line.split()[1].rsplit(":", 1)[0].strip("[]") for line in lines if line.startswith("listening: ")]
    assert len(addresses) >= 3, done.stdout  # the store, and each rank's gloo
    assert all(ipaddress.ip_address(address).is_loopback for address in addresses), done.stdout
    interface = loopback_interface()
    assert f"interfaces: gloo={interface} nccl={interface}" in lines


@pytest.mark.slow
def test_a_restarted_launch_meets_afresh(tmp_path):
    """With --max-restarts the ranks start again; each round has a store of
    its own, so a new rank never dials the gloo address of the one it
    replaced (torchrun's one-node c10d rendezvous reuses its store, and a
    restart there often fails in connectFullMesh or hangs)."""
    done = run_cli("run", "--nproc-per-node", "2", "--max-restarts", "1", str(FAILING_RANK), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("rank 1 of 2: sum=2") == 2  # both rounds ran the script
    assert "connectFullMesh" not in done.stderr
    assert "rank 1 failed first" in done.stderr
