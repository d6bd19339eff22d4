"""`download=True` on every rank: ddp wraps the statement in
`with main_process_first():` where every rank reaches it alike
(fixtures/ddp/download_main_process_first.py), and the runtime lets rank 0
run the block alone first, then the others: on 2 gloo processes, rank 1
enters only once rank 0 has left."""

import textwrap

import pytest

from launching import Launch, cpu_env, on_two

SCRIPT = """\
import os
import sys
import time

from accelmigrate.runtime.distributed import init_distributed, main_process_first

init_distributed()
log = os.path.join(sys.argv[1], "log.txt")
rank = os.environ["RANK"]
with main_process_first():
    with open(log, "a") as handle:
        handle.write(f"enter {rank}\\n")
    time.sleep(0.5 if rank == "0" else 0.0)  # rank 0 slow: the others must still wait
    with open(log, "a") as handle:
        handle.write(f"leave {rank}\\n")
"""


@pytest.mark.slow
def test_rank_zero_runs_the_block_before_the_others(tmp_path):
    script = tmp_path / "first.py"
    script.write_text(SCRIPT)
    launch = Launch(tmp_path, "first", on_two(script, str(tmp_path)), cpu_env(), tmp_path).wait().succeeded()
    assert (tmp_path / "log.txt").read_text().splitlines() == ["enter 0", "leave 0", "enter 1", "leave 1"], launch.describe()


def test_a_world_of_one_just_runs_the_block():
    from accelmigrate.runtime.distributed import main_process_first

    ran = []
    with main_process_first():
        ran.append(True)
    assert ran == [True]
