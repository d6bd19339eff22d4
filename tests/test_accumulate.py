"""accumulate=N: usage errors, the arithmetic of the migrated loop (the same
final weights as one big batch, in one process and under DDP on a real gloo
group), the amp word's order, and the runtime's `no_sync_unless`.

Parity: `accum_train.py` with `--batch-size 32` and its `accumulate=4`
migration with `--batch-size 8` see the same samples per optimizer step; with
a mean-reduced loss and SGD they must end with the same weights (float32
summation order aside). Data set sizes that are not a multiple of 32 check the
epoch's last, shorter group (divided by the micro-batches it actually holds).
"""

import contextlib
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from libcst.codemod import CodemodContext

from accelmigrate.codemods import all_codemods
from accelmigrate.codemods import UnknownCodemod
from accelmigrate.codemods.accumulate import Accumulate
from accelmigrate.engine.migrate import migrate_source
from accelmigrate.runtime.batch import no_sync_unless

from conftest import SCRIPTS, run_cli, run_launch, run_python

TOLERANCE = 1e-5

LOOP = """\
import torch
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    model(x, y).backward()
    optimizer.step()
"""


INVALID = [{}, {"value": ""}, {"value": "four"}, {"value": "2.5"}, {"value": "1"}, {"value": "0"}, {"value": "-4"}]


@pytest.mark.parametrize("options", INVALID)
def test_missing_or_invalid_value_is_a_usage_error(options):
    with pytest.raises(ValueError, match=r"accumulate"):
        Accumulate(CodemodContext(), options)


@pytest.mark.parametrize("options", INVALID[:3])
def test_invalid_value_is_refused_before_the_engine_reads_a_file(options):
    with pytest.raises(UnknownCodemod, match=r"accumulate"):
        migrate_source(LOOP, [("accumulate", options)])


def test_value_sets_the_constant_and_a_second_run_changes_nothing():
    first = migrate_source(LOOP, [("accumulate", {"value": "16"})])
    assert "ACCUMULATION_STEPS = 16  #" in first.code
    assert [f.code for f in first.findings] == ["AM600"]
    second = migrate_source(first.code, [("accumulate", {"value": "16"})])
    assert second.code == first.code and second.findings == []


def test_migrated_loop_runs_the_documented_groups():
    """Execute the migrated loop on a stub optimizer: steps and zero_grad()s
    happen at the documented micro-batches, backward sees loss / group size."""
    source = migrate_source(LOOP, [("accumulate", {"value": "4"})]).code
    events = []

    class Optimizer:
        def zero_grad(self):
            events.append("zero")

        def step(self):
            events.append("step")

    class Loss:
        def __init__(self, value):
            self.value = value

        def __truediv__(self, divisor):
            return Loss(self.value / divisor)

        def backward(self):
            events.append(self.value)

    namespace = {"loader": [(i, None) for i in range(10)], "model": lambda x, y: Loss(1.0)}
    code = source.replace("optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n", "")
    exec(compile(code, "<migrated>", "exec"), {**namespace, "optimizer": Optimizer(), "torch": torch})
    # 10 micro-batches in groups of 4, 4 and 2
    assert events == (["zero"] + [0.25] * 4 + ["step"]) * 2 + ["zero", 0.5, 0.5, "step"]


# -- parity with one big batch ------------------------------------------------------


def migrate_script(name: str, words: str, directory: Path) -> Path:
    source = (SCRIPTS / name).read_text()
    plan = []
    for word in words.split(","):
        word, _, value = word.partition("=")
        plan.append((word, {"value": value} if value else {}))
    result = migrate_source(source, plan, name)
    migrated = directory / name
    migrated.write_text(result.code)
    return migrated


def final_weights(script: Path, out_dir: Path, *args: str, sizes: tuple = (128,)) -> dict:
    """{data set size: state_dict} of one run of `script` (one process)."""
    out_dir.mkdir()
    done = run_python(script, "--out-dir", str(out_dir), "--dataset-size", *map(str, sizes), *args, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    return saved_weights(out_dir, sizes)


def saved_weights(out_dir: Path, sizes: tuple) -> dict:
    return {size: torch.load(out_dir / f"weights_{size}.pt") for size in sizes}


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[key] - b[key]).abs().max().item() for key in a)


def assert_same_weights(expected: dict, actual: dict) -> None:
    for size in expected:
        assert largest_difference(expected[size], actual[size]) <= TOLERANCE, f"data set of {size}"


@pytest.mark.slow
def test_accumulated_micro_batches_end_with_the_big_batch_weights(tmp_path):
    """128: whole groups; 112: the last group holds 2 micro-batches of 8; 100:
    the last group is one micro-batch of 4 (as is the big batch's last one)."""
    sizes = (128, 112, 100)
    original = SCRIPTS / "accum_train.py"
    migrated = migrate_script("accum_train.py", "accumulate=4", tmp_path)
    big = final_weights(original, tmp_path / "big", "--batch-size", "32", sizes=sizes)
    accumulated = final_weights(migrated, tmp_path / "accumulated", "--batch-size", "8", sizes=sizes)
    small = final_weights(original, tmp_path / "small", "--batch-size", "8", sizes=(128,))
    assert_same_weights(big, accumulated)
    assert largest_difference(big[128], small[128]) > 100 * TOLERANCE  # the comparison can tell them apart


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(script: Path, *args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        str(script), *args,
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return run_launch(command, env=env, cwd=script.parent, timeout=300)


@pytest.mark.slow
def test_ddp_accumulation_matches_the_big_batch_with_one_allreduce_per_group(tmp_path):
    """Two gloo ranks x 4 micro-batches of 8 = one step over 64 samples.
    DistributedSampler(shuffle=False) deals samples round-robin, so each
    global group covers the same 64 samples as a batch of 64 in one process.
    Run with plain python (a world of one, the model unwrapped), the
    migration matches a batch of 32."""
    sizes, epochs = (128, 160), 3
    original = SCRIPTS / "accum_ddp_train.py"
    migrated = migrate_script("accum_ddp_train.py", "accumulate=4", tmp_path)
    assert "with no_sync_unless(end_of_group, model):" in migrated.read_text()

    out = tmp_path / "ddp"
    out.mkdir()
    sizes_args = ("--dataset-size", *map(str, sizes))
    done = torchrun(migrated, "--batch-size", "8", "--count-allreduce", "--out-dir", str(out), *sizes_args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_same_weights(final_weights(original, tmp_path / "big", "--batch-size", "64", sizes=sizes), saved_weights(out, sizes))
    for size in sizes:
        micro_batches = math.ceil(size / 2 / 8)  # per rank and epoch
        expected = epochs * math.ceil(micro_batches / 4)  # one all-reduce per group: the model is one bucket
        # Both ranks print to one pipe, so their lines may run together.
        counts = re.findall(rf"size {size} allreduce calls: (\d+)", done.stdout)
        assert counts == [str(expected)] * 2

    one_process = final_weights(migrated, tmp_path / "one", "--batch-size", "8", sizes=(128,))
    assert_same_weights(final_weights(original, tmp_path / "big32", "--batch-size", "32", sizes=(128,)), one_process)


# -- with the other words ----------------------------------------------------------


def needs(*words: str) -> None:
    missing = [word for word in words if word not in all_codemods()]
    if missing:
        pytest.skip(f"codemod(s) not written yet: {', '.join(missing)}")


AMP_READY = """\
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(10, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def train(loader):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
"""


def test_amp_and_accumulate_give_one_result_in_any_order():
    """The registry's order runs amp first; running accumulate in an earlier
    invocation and amp in a later one gives the same code too."""
    needs("amp")
    together = migrate_source(AMP_READY, [("amp", {}), ("accumulate", {"value": "4"})])
    reversed_words = migrate_source(AMP_READY, [("accumulate", {"value": "4"}), ("amp", {})])
    assert together.code == reversed_words.code and together.findings == reversed_words.findings
    accumulated_first = migrate_source(AMP_READY, [("accumulate", {"value": "4"})]).code
    assert migrate_source(accumulated_first, [("amp", {})]).code == together.code
    assert "scaler.scale(loss / group_size).backward()" in together.code
    gated = together.code.split("if end_of_group:\n", 1)[1]
    for call in ("scaler.unscale_(optimizer)", "clip_grad_norm_", "scaler.step(optimizer)", "scaler.update()"):
        assert call in gated


@pytest.mark.slow
def test_ddp_word_with_accumulate_under_the_runner(tmp_path):
    """`--to ddp,accumulate=4` on the single-process script, launched by
    `accelmigrate run --nproc-per-node 2`. The ddp codemod keeps the global
    batch (8 = 2 ranks x 4), so a step covers 4 x 8 = 32 samples: the same
    weights as the original script with a batch of 32."""
    needs("ddp")
    sizes = (128, 100)
    migrated = migrate_script("accum_train.py", "ddp,accumulate=4", tmp_path)
    assert "with no_sync_unless(end_of_group, model):" in migrated.read_text()
    out = tmp_path / "ddp"
    out.mkdir()
    done = run_cli("run", "--nproc-per-node", "2", str(migrated), "--", "--batch-size", "8",
                   "--dataset-size", *map(str, sizes), "--out-dir", str(out),
                   cwd=tmp_path, env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    big = final_weights(SCRIPTS / "accum_train.py", tmp_path / "big", "--batch-size", "32", sizes=sizes)
    assert_same_weights(big, saved_weights(out, sizes))


# -- the runtime helper -------------------------------------------------------------


class Recorder(torch.nn.Module):
    """A module with a no_sync() that records its use."""

    def __init__(self):
        super().__init__()
        self.entered = 0

    @contextlib.contextmanager
    def no_sync(self):
        self.entered += 1
        yield


def test_no_sync_unless_enters_no_sync_only_when_not_syncing():
    model = Recorder()
    with no_sync_unless(True, model):
        pass
    assert model.entered == 0
    with no_sync_unless(False, model):
        pass
    assert model.entered == 1


def test_no_sync_unless_leaves_an_unwrapped_model_alone():
    with no_sync_unless(False, torch.nn.Linear(2, 2)):
        pass


# -- facts read from the script model ---------------------------------------------------


def script_of(source: str):
    import libcst as cst

    from accelmigrate.codemods.script import ScriptModel

    return ScriptModel.of(cst.parse_module(source))


def test_a_scheduler_that_may_be_none_is_still_a_scheduler():
    """`scheduler = None` then, under a flag, a StepLR: the model knows a
    scheduler, so its step is gated and reported (AM605) instead of the loop
    being refused as holding a step it cannot tell apart (AM602)."""
    source = LOOP.replace("for x, y", "scheduler = None\nif use_schedule:\n    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)\nfor x, y")
    source += "    if scheduler is not None:\n        scheduler.step()\n"
    result = migrate_source(source, [("accumulate", {"value": "4"})])
    assert [f.code for f in result.findings] == ["AM600", "AM605"]
    assert "    if end_of_group:\n        optimizer.step()\n        if scheduler is not None:\n            scheduler.step()\n" in result.code


def test_anchors_group_backward_and_steps_by_the_loop_that_repeats_them():
    from accelmigrate.codemods.script.accumulate_facts import anchors

    script = script_of(
        "import torch\n"
        "opt = torch.optim.SGD(params, lr=0.1)\n"
        "def helper(batch):\n"
        "    model(batch).backward()\n"
        "for epoch in range(2):\n"
        "    for batch in loader:\n"
        "        helper(batch)\n"
        "        opt.step()\n"
        "        model(batch).backward()\n"
    )
    in_loops, loose = anchors(script)
    (loop,) = in_loops
    assert script.line(loop) == 6 and [script.line(c) for c in in_loops[loop]] == [8, 9]
    ((function, calls),) = loose.items()
    assert function.name.value == "helper" and [script.line(c) for c in calls] == [4]


def test_ddp_models_include_a_conditional_wrap():
    from accelmigrate.codemods.script.accumulate_facts import ddp_models

    script = script_of(
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "net = DDP(net) if distributed else net\n"
        "class T:\n"
        "    def __init__(self, m):\n"
        "        self.model = DDP(m)\n"
        "other = Wrapper(net)\n"
    )
    assert ddp_models(script) == {"net", "self.model"}


@pytest.mark.parametrize(
    "definition, lengthless",
    [
        ("loader = (b for b in batches)", True),
        ("loader = zip(a, b)", True),
        ("class S(IterableDataset):\n    pass\nloader = DataLoader(S(), batch_size=2)", True),
        ("class S(IterableDataset):\n    pass\nclass T(S):\n    pass\ndata = T()\nloader = DataLoader(data)", True),
        ("class IterableDataset:\n    pass\nloader = DataLoader(IterableDataset())", False),
        ("loader = DataLoader(TensorDataset(x, y), batch_size=2)", False),
    ],
)
def test_a_loader_without_a_length_is_known(definition, lengthless):
    import libcst as cst

    from accelmigrate.codemods.script.accumulate_facts import has_no_length

    script = script_of(f"from torch.utils.data import DataLoader, IterableDataset, TensorDataset\n{definition}\nfor b in loader:\n    pass\n")
    (loop,) = [s for s in script.module.body if isinstance(s, cst.For)]
    assert has_no_length(script, loop.iter) is lengthless


def test_uses_count_names_attributes_and_string_keys():
    from accelmigrate.codemods.script.accumulate_facts import Uses

    uses = Uses.of(script_of('lr = cfg["lr"]\nopt = SGD(p, lr=args.lr)\ngetattr(args, "lr")\nd = {"lr": 1}\n'))
    assert (uses.names["lr"], uses.attributes["lr"], uses.strings["lr"], uses.subscripted["cfg"]) == (1, 1, 3, 1)
    assert {"cfg", "opt", "SGD", "args", "getattr", "d"} <= uses.identifiers and "lr" in uses.identifiers
