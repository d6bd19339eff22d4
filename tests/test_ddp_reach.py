"""The ddp codemod on the shapes real scripts have, beyond one plain model.

- end to end: three bundled scripts migrated with `--to ddp` and launched
  with `accelmigrate run --nproc-per-node 2` (gloo), each ending with the
  checkpoint of the original run in one process (within 1e-5):
  ddp_distill_aux.py (a frozen teacher left bare; a student whose auxiliary
  head some steps leave unused, so `find_unused_parameters=True`; its own
  method, attribute and a layer it names read through `unwrap_model`),
  ddp_actor_critic_sgd.py (two trained networks, one with a hand-written SGD
  step) and ddp_early_exit.py (a loop exit on a loss that differs between
  the ranks, and early stopping: rank 0 decides for all);
- the runtime: `rank_local_buffers()` spells DDP's keyword without the
  deprecation warning, `rank_zero_decides` in a world of one;
- the findings: mechanical consequences once per file, notes kept apart.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from accelmigrate.codemods import all_codemods
from accelmigrate.engine.migrate import migrate_source
from accelmigrate.runtime import distributed

from conftest import SCRIPTS
from launching import LAUNCH_VARIABLES, ONE_PROCESS_TOLERANCE, SLURM_VARIABLES, Launch, cpu_env
from test_ddp import _largest_difference

SCRIPTS_RUN = {"distill": ("ddp_distill_aux.py", "student.pt"), "a2c": ("ddp_actor_critic_sgd.py", "a2c.pt"), "early": ("ddp_early_exit.py", "early.pt")}


def _migrated(work: Path, script: str) -> Path:
    migrated = work / script
    migrated.write_text(_migrate(script))
    return migrated


@pytest.fixture(scope="module")
def reach_runs(tmp_path_factory):
    """Each script once in one process (the original) and once migrated on two."""
    work = tmp_path_factory.mktemp("reach")
    python, env = sys.executable, cpu_env()
    two = [python, "-m", "accelmigrate", "run", "--nproc-per-node", "2"]
    launches, folders = {}, {}
    for name, (script, _) in SCRIPTS_RUN.items():
        migrated = _migrated(work, script)
        for kind in ("original", "ddp"):
            folder = folders[name, kind] = work / f"{name}-{kind}"
            folder.mkdir()
        launches[name, "original"] = Launch(work, f"{name}-original", [python, str(SCRIPTS / script), str(folders[name, "original"])], env, work)
        launches[name, "ddp"] = Launch(work, f"{name}-ddp", [*two, str(migrated), "--", str(folders[name, "ddp"])], env, work)
    return {key: launch.wait() for key, launch in launches.items()}, folders


def _checkpoint(folder: Path, file: str) -> dict:
    saved = torch.load(folder / file)
    if all(isinstance(value, dict) for value in saved.values()):  # {"actor": state, "critic": state}
        return {f"{part}.{key}": value for part, state in saved.items() for key, value in state.items()}
    return saved


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCRIPTS_RUN))
def test_two_processes_end_with_the_one_process_weights(reach_runs, name):
    launches, folders = reach_runs
    for kind in ("original", "ddp"):
        assert launches[name, kind].returncode == 0, launches[name, kind].describe()
    file = SCRIPTS_RUN[name][1]
    original, migrated = _checkpoint(folders[name, "original"], file), _checkpoint(folders[name, "ddp"], file)
    assert not [key for key in migrated if "module." in key]
    assert _largest_difference(original, migrated) <= ONE_PROCESS_TOLERANCE


@pytest.mark.slow
def test_bare_model_uses_run_on_two_processes(reach_runs):
    """`student.embed(...)`, `student.classes` and a hook on `student.body`
    would raise AttributeError on the DDP wrapper; once, on rank 0."""
    launches, _ = reach_runs
    ddp = launches["distill", "ddp"]
    assert ddp.returncode == 0, ddp.describe()
    assert ddp.stdout.count("classes 4 embedding (160, 24) hooked True") == 1


@pytest.mark.slow
def test_loop_exits_are_decided_alike_on_both_ranks(reach_runs):
    """Rank 1's own loss is 0 from the first step; left to itself it would
    leave every epoch at once while rank 0 waits in the next all-reduce. Rank
    0 decides, as the one process did: the same weights, the same stop."""
    launches, _ = reach_runs
    original, ddp = launches["early", "original"], launches["early", "ddp"]
    assert original.returncode == 0 and ddp.returncode == 0, ddp.describe()
    stopped = [line for line in original.stdout.splitlines() if line.startswith("stopped at epoch")]
    assert len(stopped) == 1
    assert [line for line in ddp.stdout.splitlines() if line.startswith("stopped at epoch")] == stopped


# -- the migrated code ---------------------------------------------------------------------


def _migrate(script: str) -> str:
    return migrate_source((SCRIPTS / script).read_text(), [("ddp", {})], script).code


def test_only_the_trained_models_are_wrapped():
    distill = _migrate("ddp_distill_aux.py")
    assert "DistributedDataParallel(teacher" not in distill
    assert "student = DistributedDataParallel(student, device_ids=ddp_device_ids(student), find_unused_parameters=True)" in distill
    a2c = _migrate("ddp_actor_critic_sgd.py")
    assert "actor = DistributedDataParallel(actor, device_ids=ddp_device_ids(actor))" in a2c
    assert "critic = DistributedDataParallel(critic, device_ids=ddp_device_ids(critic))" in a2c


def test_per_rank_exits_become_rank_zero_decisions():
    early = _migrate("ddp_early_exit.py")
    assert "if rank_zero_decides(loss.item() < 1e-6):" in early
    assert "if rank_zero_decides(bad_epochs >= 3):" in early
    assert "if rank_zero_decides(val_loss" not in early  # no loop exit there


def test_rank_zero_output_is_one_finding_per_file():
    source = (SCRIPTS / "ddp_early_exit.py").read_text()
    findings = [f for f in migrate_source(source, [("ddp", {})], "early.py").findings if f.code == "AM506"]
    assert len(findings) == 1 and "2 statements" in findings[0].message


def test_information_only_codes_are_notes():
    ddp = all_codemods()["ddp"]
    assert ddp.notes == {"AM524", "AM526", "AM535", "AM536", "AM538"} and ddp.notes <= set(ddp.codes)


def test_an_already_distributed_script_passes_check():
    source = (SCRIPTS / "dp_runtime_check.py").read_text()
    findings = migrate_source(source, [("ddp", {})], "already.py").findings
    ddp = all_codemods()["ddp"]
    assert "AM526" in [f.code for f in findings]
    assert not [f for f in findings if not f.fixed and f.code not in ddp.notes]


# -- the runtime ------------------------------------------------------------------------


@pytest.fixture
def group_of_one(monkeypatch):
    """A real gloo process group of one rank, in this process."""
    for name in (*LAUNCH_VARIABLES, *SLURM_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_local_buffers_keyword_is_this_torchs_without_a_deprecation_warning(group_of_one):
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped = nn.parallel.DistributedDataParallel(model, **distributed.rank_local_buffers())
    wrapped(torch.randn(4, 3)).sum().backward()
    assert list(distributed.rank_local_buffers().values()) == [False]


def test_rank_zero_decides_in_a_group_and_alone(group_of_one):
    assert distributed.rank_zero_decides(torch.tensor(0.5) < 1) is True
    assert distributed.rank_zero_decides(0) is False
    dist.destroy_process_group()
    assert distributed.rank_zero_decides([1]) is True
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def test_random_draws_per_rank_are_a_note_not_a_manual_step():
    """Dropout in a wrapped model, numpy noise in the step: each rank draws its
    own for its share (AM535, a note); a draw that each rank takes its rows
    of (`draw_rank_share`) and a draw for samples under no_grad are not noted."""
    dropout = (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\n\n"
        "model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 2))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(list(zip(torch.randn(16, 4), torch.randint(0, 2, (16,)))), batch_size=4, shuffle=True)\n"
        "for epoch in range(2):\n    for x, y in loader:\n        optimizer.zero_grad()\n"
        "        nn.functional.cross_entropy(model(x), y).backward()\n        optimizer.step()\n"
    )
    findings = migrate_source(dropout, [("ddp", {})], "train.py").findings
    assert [f.code for f in findings if f.code == "AM535"] == ["AM535"]
    assert not [f for f in findings if not f.fixed and f.code not in all_codemods()["ddp"].notes]
    plain = dropout.replace("nn.Dropout(0.2), ", "")
    assert "AM535" not in [f.code for f in migrate_source(plain, [("ddp", {})], "train.py").findings]
    numpy_noise = plain.replace("        optimizer.zero_grad()\n", "        x = x + torch.from_numpy(np.random.normal(size=x.shape)).float()\n        optimizer.zero_grad()\n")
    numpy_noise = "import numpy as np\n" + numpy_noise
    assert "AM535" in [f.code for f in migrate_source(numpy_noise, [("ddp", {})], "train.py").findings]
    sampled = plain.replace("        optimizer.step()\n", "        optimizer.step()\n        with torch.no_grad():\n            model(torch.randn(2, 4))\n")
    assert "AM535" not in [f.code for f in migrate_source(sampled, [("ddp", {})], "train.py").findings]
