"""The fsdp codemod and the sharding runtime.

- the runtime in a world of one: `shard_model` leaves the model as it is,
  the full state dict is the bare model's, saved and loaded back;
- the codemod: refusals that the fixture pairs (fixtures/fsdp/) do not show
  (fsdp together with ddp, a name the migrated code needs), its docs;
- parity: fixtures/scripts/fsdp_tiny_transformer.py migrated with
  `--to fsdp` runs under `accelmigrate run --nproc-per-node 2` (gloo on
  CPU) and saves the one-process weights within ONE_PROCESS_TOLERANCE, with
  the keys of the bare model; run with plain `python` it matches the
  original exactly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from accelmigrate.runtime import sharding
from conftest import SCRIPTS, run_cli, run_launch

from accelmigrate.engine.migrate import migrate_source

SCRIPT = "fsdp_tiny_transformer.py"
# Two processes on half batches against one on whole ones: float sums in
# another order (measured: about 3e-7 after 24 AdamW steps).
ONE_PROCESS_TOLERANCE = 1e-5
LAUNCH_TIMEOUT = 600
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp", "_checkpoint_wrapped_module.")


def _fsdp2_on_cpu() -> bool:
    import torch.distributed as dist

    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return dist.is_available() and dist.is_gloo_available()


@pytest.fixture
def world_of_one(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(2)])
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


# -- the runtime in a world of one ------------------------------------------------


def test_world_of_one_shards_nothing(world_of_one):
    model = Stack()
    before = {name: p for name, p in model.named_parameters()}
    assert sharding.shard_model(model) is model
    assert not sharding.is_sharded(model)
    assert {name: p for name, p in model.named_parameters()} == before


def test_blocks_are_the_module_lists_entries():
    model = Stack()
    assert sharding.blocks_of(model) == list(model.blocks)


def test_world_of_one_saves_and_loads_the_bare_state_dict(world_of_one, tmp_path):
    torch.manual_seed(0)
    model, other = Stack(), Stack()
    path = tmp_path / "model.pt"
    sharding.save_full_state_dict(model, path)
    saved = torch.load(path)
    assert sorted(saved) == sorted(model.state_dict())
    sharding.load_full_state_dict(other, saved)
    assert all(torch.equal(other.state_dict()[k], v) for k, v in saved.items())


def test_world_of_one_needs_no_fsdp_in_torch(world_of_one, tmp_path, monkeypatch):
    """Builds without torch.distributed (some macOS and mobile wheels) still
    run a migrated script in one process."""
    monkeypatch.setitem(sys.modules, "torch.distributed.fsdp", None)  # import fails as there
    model = Stack()
    sharding.shard_model(model)
    sharding.save_full_state_dict(model, tmp_path / "model.pt")
    sharding.load_full_state_dict(model, torch.load(tmp_path / "model.pt"))


# -- the codemod ------------------------------------------------------------------

TRAINED = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader


    def main(train_set):
        model = nn.Linear(8, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(train_set, batch_size=16)
        for epoch in range(3):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
        torch.save(model.state_dict(), "model.pt")


    if __name__ == "__main__":
        main(torch.load("data.pt"))
    """
)


def _codes(source: str, words: list[str]) -> list[str]:
    return [f.code for f in migrate_source(source, [(w, {}) for w in words], "train.py").findings]


def test_fsdp_with_ddp_changes_nothing_and_says_choose_one():
    result = migrate_source(TRAINED, [("ddp", {}), ("fsdp", {})], "train.py")
    assert "AM767" in [f.code for f in result.findings]
    assert "shard_model" not in result.code


def test_a_name_the_migrated_code_needs_stops_fsdp():
    source = TRAINED.replace("def main(", "def shard_model(m):\n    return m\n\n\ndef main(")
    result = migrate_source(source, [("fsdp", {})], "train.py")
    assert "AM530" in [f.code for f in result.findings]
    assert "save_full_state_dict" not in result.code


def test_a_save_of_the_model_under_rank_zero_alone_is_not_made():
    """The gathered save is a collective: never under `if is_main_process()`."""
    code = migrate_source(TRAINED, [("fsdp", {})], "train.py").code
    line = next(l for l in code.splitlines() if "save_full_state_dict(model" in l)
    assert line == "    save_full_state_dict(model, \"model.pt\")"


def test_codemod_does_not_import_torch():
    check = "import sys, accelmigrate.codemods.fsdp; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", check], check=False).returncode == 0


def test_explain_and_list_show_fsdp():
    explained = run_cli("explain", "fsdp")
    assert explained.returncode == 0 and "save_full_state_dict" in explained.stdout
    code = run_cli("explain", "AM761")
    assert code.returncode == 0 and "optimizer built before the model is sharded" in code.stdout
    assert "fsdp" in run_cli("list").stdout


# -- parity on two processes --------------------------------------------------------


def _cpu_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def _launch(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    done = run_launch(command, env=_cpu_env(), cwd=cwd, timeout=LAUNCH_TIMEOUT)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The original in one process; the migrated copy in one and in two."""
    work = tmp_path_factory.mktemp("fsdp")
    migrated = work / SCRIPT
    shutil.copy(SCRIPTS / SCRIPT, migrated)
    applied = run_cli("apply", str(migrated), "--to", "fsdp", cwd=work)
    assert "shard_model(model)" in migrated.read_text(), applied.stdout + applied.stderr
    folders = {name: work / name for name in ("original", "plain", "sharded")}
    for folder in folders.values():
        folder.mkdir()
    python = sys.executable
    outputs = {
        "original": _launch([python, str(SCRIPTS / SCRIPT), "--out", str(folders["original"])], work),
        "plain": _launch([python, str(migrated), "--out", str(folders["plain"])], work),
        "sharded": _launch(
            [python, "-m", "accelmigrate", "run", "--nproc-per-node", "2", str(migrated), "--", "--out", str(folders["sharded"])],
            work,
        ),
    }
    weights = {name: torch.load(folder / "transformer.pt") for name, folder in folders.items()}
    return outputs, weights


def _last_line(text: str, start: str) -> str:
    return [line for line in text.splitlines() if line.startswith(start)][-1]


@pytest.mark.slow
@pytest.mark.skipif(not _fsdp2_on_cpu(), reason="this torch cannot run FSDP2 (fully_shard) on CPU with gloo")
def test_two_sharded_processes_end_with_the_one_process_weights(runs):
    _, weights = runs
    original, sharded = weights["original"], weights["sharded"]
    assert sorted(sharded) == sorted(original)
    assert not [key for key in sharded if key.startswith(WRAPPER_PREFIXES)]
    largest = max((original[key] - sharded[key]).abs().max().item() for key in original)
    assert largest <= ONE_PROCESS_TOLERANCE


@pytest.mark.slow
@pytest.mark.skipif(not _fsdp2_on_cpu(), reason="this torch cannot run FSDP2 (fully_shard) on CPU with gloo")
def test_reloaded_sharded_model_evaluates_as_one_process(runs):
    """After the gathered save, every rank loads the checkpoint back into its
    shards; rank 0 alone prints, with the one process's validation loss."""
    outputs, _ = runs
    printed = outputs["sharded"].stdout
    assert printed.count("validation loss") == 1
    original = float(_last_line(outputs["original"].stdout, "validation loss").split()[-1])
    assert abs(float(_last_line(printed, "validation loss").split()[-1]) - original) <= 1e-4


@pytest.mark.slow
def test_migrated_script_in_one_process_matches_the_original(runs):
    outputs, weights = runs
    assert all(torch.equal(weights["original"][key], weights["plain"][key]) for key in weights["original"])
    assert outputs["plain"].stdout == outputs["original"].stdout


# -- the runtime on two gloo processes ----------------------------------------------


def _exit_skipping_teardown(results) -> None:
    """End a worker that succeeded without the interpreter's teardown, where
    gloo can abort the process (conftest.TEARDOWN_ABORT), once what it put
    in `results` has been handed over."""
    results.close()
    results.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _shard_then_compile(rank: int, init_file: str, results) -> None:
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        bare = Stack()
        expected = {k: v.clone() for k, v in bare.state_dict().items()}
        sharded_then_compiled = torch.compile(sharding.shard_model(bare), backend="eager")
        compiled_then_sharded = sharding.shard_model(torch.compile(Stack(), backend="eager"))
        sharding.load_full_state_dict(compiled_then_sharded, expected)
        for model in (sharded_then_compiled, compiled_then_sharded):
            state = sharding.full_state_dict(model)
            if rank == 0:
                same = sorted(state) == sorted(expected) and all(torch.equal(state[k], expected[k]) for k in expected)
                results.put((same, sorted(state)))
    finally:
        dist.barrier()  # both ranks done with every collective before either tears gloo down (else it may abort)
        dist.destroy_process_group()
    _exit_skipping_teardown(results)


@pytest.mark.slow
@pytest.mark.skipif(not _fsdp2_on_cpu(), reason="this torch cannot run FSDP2 (fully_shard) on CPU with gloo")
def test_full_state_dict_of_a_compiled_sharded_model_has_the_bare_keys(tmp_path):
    """`compile` may wrap the sharded model (`model = torch.compile(model)`
    after `shard_model(model)`), or the model may be compiled before it is
    sharded: the gathered dict is the bare model's either way. Loading a full
    dict leaves the caller's dict whole (torch would put shards in it)."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_shard_then_compile, args=(rank, str(tmp_path / "init"), results)) for rank in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [p.exitcode for p in processes] == [0, 0]
    for _ in range(2):  # sharded then compiled, compiled then sharded (and loaded)
        same, keys = results.get(timeout=5)
        assert same, keys


def _accumulate_sharded(rank: int, init_file: str, results) -> None:
    """Two micro-batches per step with gradient sync only on the second, as
    `accumulate` migrates a loop, on this rank's half of each micro-batch."""
    import torch.distributed as dist

    from accelmigrate.runtime.batch import no_sync_unless

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = sharding.shard_model(Stack())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        inputs, targets = _accumulation_batches()
        for micro, (x, y) in enumerate(zip(inputs, targets)):
            with no_sync_unless(micro % 2 == 1, model):
                loss = torch.nn.functional.mse_loss(model(x[rank::2]), y[rank::2]) / 2
                loss.backward()
            if micro % 2 == 1:
                optimizer.step()
                optimizer.zero_grad()
        state = sharding.full_state_dict(model)
        if rank == 0:  # plain lists: tensors would be shared through a file descriptor this process closes on exit
            results.put({k: v.tolist() for k, v in state.items()})
    finally:
        dist.barrier()  # both ranks done with every collective before either tears gloo down (else it may abort)
        dist.destroy_process_group()
    _exit_skipping_teardown(results)


def _accumulation_batches():
    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(8, 4, generator=generator) for _ in range(4)]
    return inputs, [x.sum(1, keepdim=True) for x in inputs]


@pytest.mark.slow
@pytest.mark.skipif(not _fsdp2_on_cpu(), reason="this torch cannot run FSDP2 (fully_shard) on CPU with gloo")
def test_accumulation_on_sharded_models_syncs_once_per_step_and_matches_one_process(tmp_path):
    import torch.multiprocessing as mp

    torch.manual_seed(0)
    model = Stack()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, targets = _accumulation_batches()
    for micro, (x, y) in enumerate(zip(inputs, targets)):
        (torch.nn.functional.mse_loss(model(x), y) / 2).backward()
        if micro % 2 == 1:
            optimizer.step()
            optimizer.zero_grad()
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_accumulate_sharded, args=(rank, str(tmp_path / "init"), results)) for rank in range(2)]
    for process in processes:
        process.start()
    sharded = results.get(timeout=180)
    for process in processes:
        process.join(60)
    assert [p.exitcode for p in processes] == [0, 0]
    for key, value in model.state_dict().items():
        assert torch.allclose(torch.tensor(sharded[key]), value, atol=1e-6), key


def test_ddp_leaves_a_sharded_script_alone():
    """A script `fsdp` migrated already trains on many processes: ddp must
    not wrap DistributedDataParallel around the sharded model."""
    case = Path(__file__).resolve().parent.parent / "fixtures" / "fsdp" / "flat_mlp.py"
    sharded = migrate_source(case.read_text(), [("fsdp", {})], str(case)).code
    assert "shard_model(net)" in sharded
    again = migrate_source(sharded, [("ddp", {})], str(case))
    assert "DistributedDataParallel(" not in again.code
    assert [f.code for f in again.findings if f.code == "AM526"] == ["AM526"]
