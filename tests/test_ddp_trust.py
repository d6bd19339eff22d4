"""ddp migrations that trained wrong with no finding, each launched on two
gloo processes and compared with the one-process original:

- fixtures/ddp/wrap_alias_forward.py: the network built as `net`, the
  optimizer over `model = net`, the loop calling `net(xb)`: the wrap must be
  under `net`, or the ranks train apart;
- fixtures/ddp/gan_batch_noise.py: a GAN whose noise is sized by the batch:
  each rank draws its own rows of the original's noise (not the same noise as
  the other rank), and the ranks end with the original's weights;
- fixtures/ddp/gan_global_batch_size.py: the loop shapes its tensors (and
  its noise) with the loader's global `batch_size`: they must read this
  process's share;
- fixtures/ddp/wrap_sibling_function.py: the wrapped model given to a
  function of a sibling module that reads `net.n_classes`: it gets the bare
  module, and the run prints the original's accuracy;
- fixtures/ddp/gan_info_heads.py: a discriminator with two heads, one left
  unused by its own loss: `find_unused_parameters=True`, or DDP fails the
  second step;
- fixtures/ddp/gan_trainer_device_branch.py: a trainer class that places
  both networks (and its loss) in one `if self.gpu_mode:` branch after their
  optimizers are built: each wrap goes after the branch;
- fixtures/ddp/resume_branch_move.py: the model made afresh or resumed in
  the two branches of an `if`, moved once after it: the wrap goes after the
  move (either branch's model), and the checkpoint holds the model itself.

The fixture inputs are the runnable originals; the launches all start at once.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import FIXTURES, run_cli
from launching import ONE_PROCESS_TOLERANCE, RANK_WEIGHTS, Launch, assert_ranks_agree, cpu_env, largest_parameter_difference, rank_weights

CASES = FIXTURES / "ddp"
CASES_RUN = (
    "wrap_alias_forward", "gan_batch_noise", "gan_global_batch_size", "wrap_sibling_function", "gan_info_heads",
    "gan_trainer_device_branch", "resume_branch_move",
)
# The sibling module wrap_sibling_function.py imports: it reads the model's own attribute.
EVALUATION = textwrap.dedent(
    """\
    import torch
    import torch.nn.functional as F


    def loss_of(net, x, y):
        return F.cross_entropy(net(x), y)


    def log_step(net, optimizer):
        assert optimizer.param_groups[0]["lr"] > 0


    @torch.no_grad()
    def evaluate(net, data):
        x, y = data.tensors
        return (net(x).argmax(1) == y).float().mean().item() * net.n_classes / net.n_classes
    """
)
# Runs a script as RANK_WEIGHTS does, and also keeps the first input of the
# first module of class `Generator`: the noise of the first step, per rank.
NOISE_WATCHER = textwrap.dedent(
    """\
    import os, runpy, sys
    import torch

    out = sys.argv[1]
    seen = []

    def keep_first_noise(module, inputs):
        if type(module).__name__ == "Generator" and not seen:
            seen.append(inputs[0].detach().clone())

    torch.nn.modules.module.register_module_forward_pre_hook(keep_first_noise)
    sys.argv = [{weights!r}, *sys.argv[2:]]  # OUT_DIR train.py, for the weights watcher
    runpy.run_path({weights!r}, run_name="__main__")
    if seen:
        torch.save(seen[0], os.path.join(out, "noise-rank" + os.environ.get("RANK", "0") + ".pt"))
    """
)


def _migrate(work: Path, case: str) -> Path:
    migrated = work / f"{case}.py"
    shutil.copy(CASES / f"{case}.py", migrated)
    shutil.copy(CASES / f"{case}.py", work / f"{case}.original.py")
    applied = run_cli("apply", str(migrated), "--to", "ddp", cwd=work)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    return migrated


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    work = tmp_path_factory.mktemp("ddp-trust")
    watcher = work / "noise_watcher.py"
    watcher.write_text(NOISE_WATCHER.format(weights=str(RANK_WEIGHTS)))
    (work / "evaluation.py").write_text(EVALUATION)
    python, env = sys.executable, cpu_env()
    two = [python, "-m", "accelmigrate", "run", "--nproc-per-node", "2", "--force"]
    plans = {}
    for case in CASES_RUN:
        migrated = _migrate(work, case)
        plans[f"{case}-original"] = [python, str(watcher), "{folder}", "{folder}", str(work / f"{case}.original.py")]
        plans[f"{case}-ddp"] = [*two, str(watcher), "--", "{folder}", "{folder}", str(migrated)]
    folders, started = {}, {}
    for name, command in plans.items():
        folders[name] = work / name
        folders[name].mkdir()
        command = [part.format(folder=folders[name]) for part in command]
        started[name] = Launch(work, name, command, env, folders[name])
    return {name: launch.wait() for name, launch in started.items()}, folders


def _one_process_weights(launches, folders, case: str) -> list[torch.Tensor]:
    original = launches[f"{case}-original"]
    assert original.returncode == 0, original.describe()
    (weights,) = rank_weights(folders[f"{case}-original"])
    return weights


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_RUN)
def test_two_ranks_end_with_the_one_process_weights(launches, case):
    """Wrapped under the name training calls (else each rank trains its own
    copy), with each rank's share of the noise (else the fakes repeat),
    tensors shaped with the per-process batch (else a shape error), the bare
    model for another module's function (else an AttributeError), unused
    parameters allowed where a head goes unused (else DDP's reduction error)."""
    runs, folders = launches
    weights = assert_ranks_agree(runs[f"{case}-ddp"], folders[f"{case}-ddp"])
    assert largest_parameter_difference(_one_process_weights(runs, folders, case), weights) <= ONE_PROCESS_TOLERANCE


@pytest.mark.slow
def test_gan_ranks_draw_their_own_rows_of_the_original_noise(launches):
    runs, folders = launches
    assert runs["gan_batch_noise-ddp"].returncode == 0, runs["gan_batch_noise-ddp"].describe()
    original = torch.load(folders["gan_batch_noise-original"] / "noise-rank0.pt")
    ranks = [torch.load(folders["gan_batch_noise-ddp"] / f"noise-rank{rank}.pt") for rank in range(2)]
    assert original.shape[0] == 16 and [r.shape[0] for r in ranks] == [8, 8]
    assert not torch.equal(ranks[0], ranks[1]), "both ranks drew the same noise"
    # Rank r's samples are the original batch's r, r + 2, ...: so are its noise rows.
    assert torch.equal(ranks[0], original[0::2]) and torch.equal(ranks[1], original[1::2])


@pytest.mark.slow
def test_sibling_function_reads_the_bare_model_and_prints_the_original_accuracy(launches):
    runs, _ = launches
    original, migrated = runs["wrap_sibling_function-original"], runs["wrap_sibling_function-ddp"]
    assert migrated.returncode == 0 and "AttributeError" not in migrated.stderr, migrated.describe()
    epochs = [line for line in migrated.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 3 and epochs == [line for line in original.stdout.splitlines() if line.startswith("epoch ")]


def test_alias_is_wrapped_where_the_forward_is_called():
    from accelmigrate.engine.migrate import migrate_source

    code = migrate_source((CASES / "wrap_alias_forward.py").read_text(), [("ddp", {})], "wrap_alias_forward.py").code
    assert "model = net\n    if is_distributed():\n        net = DistributedDataParallel(net," in code
    assert "torch.save(model.state_dict()" in code  # the bare module: keys without `module.`


def test_draw_rank_share_is_the_original_draw_in_a_world_of_one_and_its_rows_on_a_rank(monkeypatch):
    from accelmigrate.runtime.distributed import draw_rank_share

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    torch.manual_seed(1)
    original = torch.randn(6, 3)
    torch.manual_seed(1)
    assert torch.equal(draw_rank_share(torch.randn, 6, 3), original)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    torch.manual_seed(1)
    share = draw_rank_share(torch.randn, 3, 3)
    assert torch.equal(share, original[1::2]) and share.is_contiguous()
