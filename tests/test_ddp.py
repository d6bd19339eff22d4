"""The ddp codemod and accelmigrate.runtime.distributed, beyond the fixture pairs.

- the runtime in a world of one (this process) and across two real gloo
  processes started as SLURM tasks;
- end to end: fixtures/scripts/dp_parity.py, a DataParallel script, migrated
  with `accelmigrate apply --to ddp` and launched with `accelmigrate run
  --nproc-per-node 2`, ends with the weights, the validation accuracy, the
  epoch lines and the one checkpoint of the original run in one process;
  shuffled, each rank trains on its own share, in a new order every epoch;
  and plain `python train.py` still behaves as the original;
- every runnable script that ddp migrates here, run on two gloo processes,
  ends with the same weights on both ranks (read through
  fixtures/scripts/ddp_rank_weights.py, which watches the optimizers from
  outside), and with the weights of the original one-process run where the
  data order allows it: dp_parity.py, ddp_optimizer_factory.py (the optimizer
  built in a factory: the wrap must be where training calls the model),
  ddp_checkpoint_reload.py (rank 0 writes a checkpoint that every rank reads
  back, and a scratch file it removes) and ddp_seeded_shuffle.py (a seeded
  shuffle with dropout, whose migration prints exactly the original's losses
  under plain `python`);
- flat scripts (no main guard): ddp_plain_flat.py, one model without
  DataParallel, launched without `--force`, saves the one-process weights;
  gan_tutorial.py, with and without BatchNorm, wraps both models, prints and
  saves once without `module.` keys, its ranks end equal, and DDP warns of no
  deprecated keyword (the discriminator's local buffers are spelled by the
  runtime for the torch that runs it).

All launches of this module start together, once (they cost seconds each).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst
import pytest
import torch
import torch.nn as nn

from accelmigrate.codemods import UnknownCodemod
from accelmigrate.codemods.script.ddp_spelling import is_unbound, reads_import_of, spelling_at
from accelmigrate.codemods.script.uses import uses_of
from accelmigrate.engine.migrate import migrate_source
from accelmigrate.runtime import distributed

from conftest import ROOT, SCRIPTS, run_cli
from launching import (
    LAUNCH_VARIABLES,
    ONE_PROCESS_TOLERANCE,
    RANK_WEIGHTS,
    SLURM_VARIABLES,
    Launch,
    assert_ranks_agree,
    cpu_env,
    free_port,
    largest_parameter_difference,
    rank_weights,
)

EPOCHS = 3
SHUFFLED_EPOCHS = 2
TRAIN_SAMPLES = 256  # dp_parity.py's training set


@pytest.fixture
def world_of_one(monkeypatch):
    for name in (*LAUNCH_VARIABLES, *SLURM_VARIABLES):
        monkeypatch.delenv(name, raising=False)


# -- the runtime in a world of one ------------------------------------------------


def test_world_of_one_needs_no_process_group(world_of_one):
    assert distributed.init_distributed() is False
    assert not distributed.is_distributed()
    assert distributed.is_main_process() and distributed.global_rank() == 0 and distributed.world_size() == 1
    distributed.barrier()  # nothing to wait for
    distributed.destroy_distributed()
    with distributed.distributed_session() as joined:
        assert joined is False


def test_several_processes_without_a_group_fail_loudly(monkeypatch, world_of_one):
    """Sharding the data without a wrapped model would train one model per rank."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="init_distributed"):
        distributed.is_distributed()


@pytest.mark.parametrize("seeded_generator", [False, True])
def test_world_of_one_sampler_shuffles_as_shuffle_true_did(world_of_one, seeded_generator):
    """The same order every epoch, and the same random stream after it, as the
    RandomSampler that `DataLoader(shuffle=True)` builds (torch's global
    generator, or the loader's own)."""
    data = list(range(50))

    def orders(make_sampler) -> tuple[list, torch.Tensor]:
        torch.manual_seed(3)
        generator = torch.Generator().manual_seed(5) if seeded_generator else None
        sampler = make_sampler(generator)
        seen = []
        for epoch in range(3):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
            seen.append(list(sampler))
        return seen, torch.rand(4)

    original = orders(lambda g: torch.utils.data.RandomSampler(data, generator=g))
    migrated = orders(lambda g: distributed.SeededDistributedSampler(data, shuffle=True, generator=g))
    assert migrated[0] == original[0] and original[0][0] != original[0][1]
    assert torch.equal(migrated[1], original[1])


def test_world_of_one_sampler_without_shuffle_is_sequential(world_of_one):
    assert list(distributed.SeededDistributedSampler(list(range(7)))) == list(range(7))


def test_world_of_one_sums_and_means_are_local(world_of_one):
    assert distributed.sum_across_ranks(3) == 3.0
    assert distributed.sum_across_ranks(3, torch.tensor([1.5])) == (3.0, 1.5)
    assert distributed.mean_across_ranks(6, 4) == 1.5
    assert math.isnan(distributed.mean_across_ranks(0, 0))


def test_unwrap_model_removes_every_wrapper():
    model = nn.Linear(2, 2)
    assert distributed.unwrap_model(model) is model
    assert distributed.unwrap_model(nn.DataParallel(model)) is model
    assert list(distributed.unwrap_model(nn.DataParallel(model)).state_dict()) == ["weight", "bias"]


def test_device_ids_follow_the_model(world_of_one):
    assert distributed.ddp_device_ids(nn.Linear(2, 2)) is None
    assert distributed.ddp_device_ids(nn.ReLU()) is None


def test_batch_is_split_evenly_or_not_at_all(monkeypatch, world_of_one):
    assert distributed.per_process_batch_size(30) == 30
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert distributed.per_process_batch_size(64) == 16
    with pytest.raises(ValueError, match="cannot be split evenly across 4 processes"):
        distributed.per_process_batch_size(30)


@pytest.mark.parametrize(
    "nodelist, first",
    [("gpu07", "gpu07"), ("gpu[07-09,12],cpu01", "gpu07"), ("node[3,5]", "node3"), ("a1,b2", "a1"), ("localhost", "localhost")],
)
def test_first_slurm_host(nodelist, first):
    assert distributed.first_slurm_host(nodelist) == first


def _init_in_child(queue) -> None:
    queue.put(distributed.init_distributed())


def test_processes_started_by_multiprocessing_do_not_join(monkeypatch, world_of_one):
    """A DataLoader worker that re-imports the script (spawn, forkserver) must
    not try to join the group as a second rank of the same number."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_init_in_child, args=(queue,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) is False


# -- the tool side stays free of torch ------------------------------------------------


def test_codemod_does_not_import_torch():
    check = "import sys, accelmigrate.codemods.ddp, accelmigrate.codemods.sync_bn; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", check], cwd=ROOT).returncode == 0


def test_unknown_option_is_refused_before_anything_runs():
    source = (SCRIPTS / "dp_parity.py").read_text()
    with pytest.raises(UnknownCodemod, match="ddp=per-process"):
        migrate_source(source, [("ddp", {"value": "sideways"})])


# -- the facts ddp and sync-bn read from the script model ------------------------------


def _model_of(source: str):
    from accelmigrate.codemods.script import ScriptModel

    return ScriptModel.of(libcst.parse_module(textwrap.dedent(source)))


def _lines(model, nodes) -> list[int]:
    return [model.line(node) for node in nodes]


def test_reads_of_a_binding_follow_python_scoping():
    model = _model_of(
        """\
        model = Net()
        def train(loader):
            for x in loader:
                model(x).sum().backward()
        def other():
            model = Net()
            return model
        print(model.fc, dict(model=1), [model for _ in range(2)])
        """
    )
    uses = uses_of(model)
    # not the local `model` of other(), the attribute `.fc`, nor the keyword `model=`
    assert _lines(model, uses.reads("model", model.module_scope)) == [4, 8, 8]
    (local,) = model.function("other").scope.bindings["model"]
    assert _lines(model, uses.reads("model", local.scope)) == [7]


def test_trains_follows_the_files_own_functions_three_calls_deep():
    model = _model_of(
        """\
        def backward_of(loss):
            loss.backward()
        def one(loss):
            backward_of(loss)
        def two(loss):
            one(loss)
        def three(loss):
            two(loss)
        for loss in losses:
            two(loss)
        for loss in losses:
            three(loss)
        for loss in losses:
            print(loss)
        """
    )
    uses = uses_of(model)
    two_deep, too_deep, no_training = (s for s in model.module.body if isinstance(s, libcst.For))
    assert [uses.trains(loop.body) for loop in (two_deep, too_deep, no_training)] == [True, False, False]
    assert uses_of(model) is uses  # built once per model


def test_generated_names_are_spelled_with_what_reads_the_module_there():
    model = _model_of(
        """\
        import os
        import torch.nn as nn
        def shadowed():
            torch = nn.Linear(2, 2)
            os = "somewhere"
            return DistributedDataParallel(torch)
        wrapped = DistributedDataParallel(nn.Linear(2, 2))
        """
    )
    inside, outside = (c for c in uses_of(model).calls if isinstance(c.func, libcst.Name) and c.func.value == "DistributedDataParallel")
    paths = (("torch", "nn.SyncBatchNorm"), ("torch.nn", "SyncBatchNorm"))
    assert spelling_at(model, inside, paths) == "nn.SyncBatchNorm" == spelling_at(model, outside, paths)
    assert (reads_import_of(model, outside, "os", "os"), reads_import_of(model, inside, "os", "os")) == (True, False)
    assert (is_unbound(model, outside, "torch"), is_unbound(model, inside, "torch")) == (True, False)


def test_ddp_and_sync_bn_ask_the_model_not_libcsts_scope_analysis():
    # LibCST's scopes cost more than linear time in the file's size; the model's are one walk.
    from libcst.metadata import ScopeProvider

    from accelmigrate.codemods import all_codemods

    for word in ("ddp", "sync-bn"):
        assert ScopeProvider not in all_codemods()[word].get_inherited_dependencies()


# -- launches -------------------------------------------------------------------------


def _migrated(work: Path, script: str) -> Path:
    """`accelmigrate apply --to ddp` on a copy of a bundled script."""
    migrated = work / script
    shutil.copy(SCRIPTS / script, migrated)
    applied = run_cli("apply", str(migrated), "--to", "ddp", cwd=work)
    assert "DistributedDataParallel" in migrated.read_text(), applied.stdout + applied.stderr
    return migrated


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Migrate the scripts, then start every launch of this module at once."""
    work = tmp_path_factory.mktemp("ddp")
    train = work / "train.py"
    shutil.copy(_migrated(work, "dp_parity.py"), train)
    factory, reload, seeded = (_migrated(work, f"ddp_{name}.py") for name in ("optimizer_factory", "checkpoint_reload", "seeded_shuffle"))
    names = ("original", "plain", "ddp", "shuffled", "trace", "factory-original", "factory-ddp", "reload-original", "reload-ddp", "seeded-ddp")
    folders = {name: work / name for name in names}
    for folder in folders.values():
        folder.mkdir()
    python, env = sys.executable, cpu_env()
    two = [python, "-m", "accelmigrate", "run", "--nproc-per-node", "2"]

    def watched(name: str, script: Path, *args: str) -> list[str]:
        """One process, its optimizers' final parameters kept in folders[name]."""
        return [python, str(RANK_WEIGHTS), str(folders[name]), str(script), *args]

    def watched_on_two(name: str, script: Path, *args: str) -> list[str]:
        # The watcher starts the migrated script itself, so the launcher cannot
        # see the process group that script joins: --force.
        return [*two, "--force", str(RANK_WEIGHTS), "--", str(folders[name]), str(script), *args]

    launches = {
        "original": Launch(work, "original", watched("original", SCRIPTS / "dp_parity.py", "--out", str(folders["original"]), "--epochs", str(EPOCHS)), env, work, outputs=folders["original"]),
        "plain": Launch(work, "plain", [python, str(train), "--out", str(folders["plain"]), "--epochs", str(EPOCHS)], env, work, outputs=folders["plain"]),
        "ddp": Launch(work, "ddp", watched_on_two("ddp", train, "--out", str(folders["ddp"]), "--epochs", str(EPOCHS)), env, work, outputs=folders["ddp"]),
        "factory-original": Launch(work, "factory-original", watched("factory-original", SCRIPTS / "ddp_optimizer_factory.py"), env, work, outputs=folders["factory-original"]),
        "factory-ddp": Launch(work, "factory-ddp", watched_on_two("factory-ddp", factory), env, work, outputs=folders["factory-ddp"]),
        "reload-original": Launch(work, "reload-original", watched("reload-original", SCRIPTS / "ddp_checkpoint_reload.py", "--out", str(folders["reload-original"])), env, work, outputs=folders["reload-original"]),
        "reload-ddp": Launch(work, "reload-ddp", watched_on_two("reload-ddp", reload, "--out", str(folders["reload-ddp"])), env, work, outputs=folders["reload-ddp"]),
        "seeded-original": Launch(work, "seeded-original", [python, str(SCRIPTS / "ddp_seeded_shuffle.py")], env, work),
        "seeded-plain": Launch(work, "seeded-plain", [python, str(seeded)], env, work),
        "seeded-ddp": Launch(work, "seeded-ddp", watched_on_two("seeded-ddp", seeded), env, work, outputs=folders["seeded-ddp"]),
        "sampler": Launch(work, "sampler", [*two, str(SCRIPTS / "ddp_sampler_check.py")], env, work),
        "shuffled": Launch(
            work, "shuffled",
            [*two, str(train), "--", "--out", str(folders["shuffled"]), "--epochs", str(SHUFFLED_EPOCHS), "--shuffle", "--trace", str(folders["trace"])],
            env, work,
        ),
    }
    port = str(free_port())
    for rank in range(2):
        slurm = cpu_env(
            SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2",
            SLURM_JOB_NODELIST="localhost", SLURM_JOB_ID="4242", MASTER_PORT=port,
        )
        launches[f"slurm{rank}"] = Launch(work, f"slurm{rank}", [python, str(SCRIPTS / "dp_runtime_check.py"), "--fail-rank", "1"], slurm, work)
    return {name: launch.wait() for name, launch in launches.items()}, folders, train


def _epoch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("epoch ")]


def _checkpoints(folder: Path) -> list[Path]:
    return sorted(folder.glob("final-*.pt"))


def _weights(folder: Path) -> dict:
    (checkpoint,) = _checkpoints(folder)
    return torch.load(checkpoint, map_location="cpu")


def _largest_difference(original: dict, migrated: dict) -> float:
    original = {key.removeprefix("module."): value for key, value in original.items()}
    assert sorted(original) == sorted(migrated)
    return max((original[key] - migrated[key]).abs().max().item() for key in original)


@pytest.mark.slow
def test_original_runs(runs):
    launches, folders, _ = runs
    original = launches["original"]
    assert original.returncode == 0, original.describe()
    assert len(_epoch_lines(original.stdout)) == EPOCHS
    assert all(key.startswith("module.") for key in _weights(folders["original"]))  # DataParallel's keys


@pytest.mark.slow
def test_migrated_script_still_runs_with_plain_python(runs):
    launches, folders, _ = runs
    plain = launches["plain"]
    assert plain.returncode == 0, plain.describe()
    assert _epoch_lines(plain.stdout) == _epoch_lines(launches["original"].stdout)
    assert _largest_difference(_weights(folders["original"]), _weights(folders["plain"])) <= 1e-6


@pytest.mark.slow
def test_two_processes_end_with_the_original_weights(runs):
    launches, folders, _ = runs
    assert launches["ddp"].returncode == 0, launches["ddp"].describe()
    assert _largest_difference(_weights(folders["original"]), _weights(folders["ddp"])) <= 1e-5


@pytest.mark.slow
def test_two_processes_print_each_epoch_line_once_with_the_original_accuracy(runs):
    launches, _, _ = runs
    assert launches["ddp"].returncode == 0, launches["ddp"].describe()
    original = _epoch_lines(launches["original"].stdout)
    assert len(original) == EPOCHS
    assert _epoch_lines(launches["ddp"].stdout) == original


@pytest.mark.slow
def test_two_processes_write_one_checkpoint_without_module_prefix(runs):
    launches, folders, _ = runs
    assert launches["ddp"].returncode == 0, launches["ddp"].describe()
    assert len(_checkpoints(folders["ddp"])) == 1
    assert not [key for key in _weights(folders["ddp"]) if key.startswith("module.")]


@pytest.mark.slow
def test_shuffled_ranks_see_disjoint_shares_in_a_new_order_every_epoch(runs):
    launches, folders, _ = runs
    assert launches["shuffled"].returncode == 0, launches["shuffled"].describe()
    traces = sorted(folders["trace"].glob("seen-*.txt"))
    assert len(traces) == 2, "one trace per rank"
    per_rank = [[[int(i) for i in line.split()] for line in trace.read_text().splitlines()] for trace in traces]
    assert all(len(epochs) == SHUFFLED_EPOCHS for epochs in per_rank)
    for epoch in range(SHUFFLED_EPOCHS):
        first, second = per_rank[0][epoch], per_rank[1][epoch]
        assert len(first) == len(second) == TRAIN_SAMPLES // 2
        assert not set(first) & set(second), f"epoch {epoch}: a sample was seen by both ranks"
        assert set(first) | set(second) == set(range(TRAIN_SAMPLES))
    for epochs in per_rank:
        assert epochs[0] != epochs[1], "the same order in two epochs: set_epoch missing"
        assert epochs[0] != sorted(epochs[0]), "not shuffled"


@pytest.mark.slow
def test_runtime_across_two_slurm_tasks(runs):
    launches, _, _ = runs
    reports = {}
    for rank in range(2):
        launch = launches[f"slurm{rank}"]
        lines = [line for line in launch.stdout.splitlines() if line.startswith("{")]
        assert lines, launch.describe()
        reports[rank] = json.loads(lines[0])
        assert f"rank {rank} left the group at exit: True" in launch.stdout, launch.describe()
    assert launches["slurm0"].returncode == 0, launches["slurm0"].describe()
    assert launches["slurm1"].returncode != 0 and "planned failure on rank 1" in launches["slurm1"].stderr
    for rank, report in reports.items():
        assert report["rank"] == rank and report["world"] == 2 and report["joined"] and report["group_size"] == 2
        assert report["backend"] == "gloo"
        assert report["main"] == (rank == 0)
        # totals 10 and 20 over 2 and 3 samples: 30 / 5, not the mean of 5 and 6.67
        assert report["total"] == 30.0 and report["count"] == 5.0 and report["mean"] == 6.0
        assert report["unwrapped"] and report["keys"] == ["bias", "weight"]
        assert report["device_ids"] is None
        assert report["batch"] == 32


# -- every rank ends with the same weights --------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, original",
    [("ddp", "original"), ("factory-ddp", "factory-original"), ("reload-ddp", "reload-original"), ("seeded-ddp", None)],
)
def test_both_ranks_end_with_the_same_weights(runs, name, original):
    """And those of the one-process original, where the data order is the same
    (unshuffled: half batches on each rank make the original's whole batches).
    A model wrapped in a function that training never reaches (an optimizer
    factory) fails here: each rank trains its own copy."""
    launches, folders, _ = runs
    weights = assert_ranks_agree(launches[name], folders[name])
    if original is not None:
        assert launches[original].returncode == 0, launches[original].describe()
        (one_process,) = rank_weights(folders[original])
        assert largest_parameter_difference(one_process, weights) <= ONE_PROCESS_TOLERANCE


@pytest.mark.slow
def test_rank_zero_checkpoint_is_read_back_by_every_rank_then_removed(runs):
    """Each rank waits for the file rank 0 writes before reading it, and the
    scratch file goes only once every rank has read it."""
    launches, folders, _ = runs
    reload = launches["reload-ddp"]
    assert reload.returncode == 0, reload.describe()
    assert "FileNotFoundError" not in reload.stderr and "EOFError" not in reload.stderr
    assert sorted(p.name for p in folders["reload-ddp"].glob("*.pt") if not p.name.startswith("weights-")) == ["best.pt"]
    best = [line for line in reload.stdout.splitlines() if line.startswith("best val_loss")]
    assert best == [line for line in launches["reload-original"].stdout.splitlines() if line.startswith("best val_loss")]


@pytest.mark.slow
def test_seeded_shuffle_keeps_its_losses_under_plain_python(runs):
    """A world of one draws the order from the script's seed as `shuffle=True`
    did, and leaves the random stream (dropout) as the original did."""
    launches, _, _ = runs
    original, plain = launches["seeded-original"], launches["seeded-plain"]
    assert original.returncode == 0, original.describe()
    assert plain.returncode == 0, plain.describe()
    assert len(_epoch_lines(original.stdout)) == 4
    assert _epoch_lines(plain.stdout) == _epoch_lines(original.stdout)


def _json_objects(text: str) -> list:
    """The JSON objects that ranks printed to one pipe, where one rank's line
    may run into another's."""
    decoder, found, at = json.JSONDecoder(), [], text.find("{")
    while at != -1:
        try:
            value, end = decoder.raw_decode(text, at)
        except ValueError:
            value, end = None, at + 1
        if isinstance(value, dict):
            found.append(value)
        at = text.find("{", end)
    return found


@pytest.mark.slow
def test_sampler_shuffles_alike_on_every_rank_from_rank_zero_seeding(runs):
    """Ranks seeded differently still share rank 0's seed: disjoint shares that
    cover the data set, a new order each epoch."""
    launches, _, _ = runs
    launch = launches["sampler"]
    assert launch.returncode == 0, launch.describe()
    reports = sorted(_json_objects(launch.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1]
    assert reports[0]["seed"] == reports[1]["seed"]
    for epoch in range(2):
        first, second = reports[0]["epochs"][epoch], reports[1]["epochs"][epoch]
        assert not set(first) & set(second) and set(first) | set(second) == set(range(20))
    assert reports[0]["epochs"][0] != reports[0]["epochs"][1]


# -- flat scripts: one plain model, and a GAN of two ------------------------------------

GAN_EPOCHS = 3


@pytest.fixture(scope="module")
def flat_runs(tmp_path_factory):
    """Flat scripts (no main guard) migrated with `--to ddp` and launched on
    two processes: ddp_plain_flat.py without `--force` (the migrated script
    joins the group itself), gan_tutorial.py with and without BatchNorm under
    the weights watcher."""
    work = tmp_path_factory.mktemp("flat")
    plain, gan = _migrated(work, "ddp_plain_flat.py"), _migrated(work, "gan_tutorial.py")
    names = ("plain-original", "plain-ddp", "gan", "gan-batchnorm")
    folders = {name: work / name for name in names}
    for folder in folders.values():
        folder.mkdir()
    python, env = sys.executable, cpu_env()
    two = [python, "-m", "accelmigrate", "run", "--nproc-per-node", "2"]

    def watched_gan(name: str, *flags: str) -> list[str]:
        folder = str(folders[name])
        return [*two, "--force", str(RANK_WEIGHTS), "--", folder, str(gan), "--out", folder, "--epochs", str(GAN_EPOCHS), *flags]

    launches = {
        "plain-original": Launch(work, "plain-original", [python, str(SCRIPTS / "ddp_plain_flat.py"), str(folders["plain-original"])], env, work),
        "plain-ddp": Launch(work, "plain-ddp", [*two, str(plain), "--", str(folders["plain-ddp"])], env, work),
        "gan": Launch(work, "gan", watched_gan("gan"), env, work),
        "gan-batchnorm": Launch(work, "gan-batchnorm", watched_gan("gan-batchnorm", "--batchnorm"), env, work),
    }
    return {name: launch.wait() for name, launch in launches.items()}, folders, gan


@pytest.mark.slow
def test_plain_flat_script_on_two_processes_ends_with_the_one_process_weights(flat_runs):
    launches, folders, _ = flat_runs
    for name in ("plain-original", "plain-ddp"):
        assert launches[name].returncode == 0, launches[name].describe()
    assert len(_epoch_lines(launches["plain-ddp"].stdout)) == 4, "each epoch line printed once"
    original = torch.load(folders["plain-original"] / "plain.pt")
    migrated = torch.load(folders["plain-ddp"] / "plain.pt")
    assert _largest_difference(original, migrated) <= ONE_PROCESS_TOLERANCE


def test_flat_gan_wraps_both_models_the_discriminator_with_local_buffers():
    source = (SCRIPTS / "gan_tutorial.py").read_text()
    code = migrate_source(source, [("ddp", {})], "gan_tutorial.py").code
    assert "netG = DistributedDataParallel(netG, device_ids=ddp_device_ids(netG))\n" in code
    assert "netD = DistributedDataParallel(netD, device_ids=ddp_device_ids(netD), **rank_local_buffers())\n" in code
    assert 'unwrap_model(netG).state_dict(), "discriminator": unwrap_model(netD).state_dict()' in code


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gan", "gan-batchnorm"])
def test_flat_gan_on_two_processes_keeps_ranks_equal_and_saves_once(flat_runs, name):
    launches, folders, migrated = flat_runs
    assert "if __name__ == \"__main__\":\n    init_distributed()" in migrated.read_text()
    assert_ranks_agree(launches[name], folders[name])
    assert "FutureWarning" not in launches[name].stderr, "a deprecated DDP keyword"
    assert len(_epoch_lines(launches[name].stdout)) == GAN_EPOCHS, "each epoch line printed once"
    (checkpoint,) = folders[name].glob("gan*.pt")
    saved = torch.load(checkpoint)
    assert sorted(saved) == ["discriminator", "generator"]
    assert all(not key.startswith("module.") for state in saved.values() for key in state)
    has_running_stats = any(key.endswith("running_mean") for key in saved["discriminator"])
    assert has_running_stats == (name == "gan-batchnorm")
