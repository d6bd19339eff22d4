"""ddp on the model side of real scripts: where the model is moved, which model
an optimizer trains, and which of the model's own methods run on the bare module.

- a model moved after its optimizer is made (`model.cuda()`, `if args.cuda:
  net = nn.DataParallel(net); net.cuda()`): the optimizer holds the same
  parameters, so the wrap goes after the last move;
- an optimizer made by the model's own method (`configure_optimizers`,
  nanoGPT's) or by a factory given `model.parameters()`, or over param
  groups of named parameters: that model trains, and is wrapped;
- the model's own methods in training that compute nothing from the
  parameters (`init_hidden()`), or whose result is detached where it is made
  (codes for a histogram), run on `unwrap_model(model)`; one that only
  returns `self(x)` becomes a call of the wrapper (`net(x)`); a method that
  computes the loss through the parameters stays refused (AM527,
  fixtures/ddp/own_method_in_training.py).

End to end: each script runs as `python` with the original's losses, and
under `accelmigrate run --nproc-per-node 2` (gloo) both ranks end with the
one-process original's trained parameters (within 1e-5).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import libcst as cst
import pytest

from accelmigrate.codemods.script.entities import plain_forward, touches_no_parameter
from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES, ROOT, run_cli
from launching import ONE_PROCESS_TOLERANCE, RANK_WEIGHTS, Launch, assert_ranks_agree, cpu_env, largest_parameter_difference, rank_weights

CASES = FIXTURES / "ddp"
REACH = ROOT / "benchmarks" / "reach"
FIXTURES_RUN = (
    "moved_after_optimizer", "own_method_init_hidden", "own_method_metrics", "own_method_plain_forward", "configure_optimizers_groups",
)
REACH_RUN = ("dataparallel_chain_cuda", "rnn_init_hidden_2018", "word_lm_structured", "trainer_factory_scheduler", "tiny_gpt_config")
# Trained by a hand-written update, which the weights watcher cannot see: both
# ranks draw every batch (nothing shards them), so rank 0 prints the original's losses.
PRINTED_ONLY = ("word_lm_structured",)
# Its batches are split between the ranks by the data side; AdamW turns the
# float-order differences of the halved batches into ~1e-4 of the weights,
# past the tolerance (with whole batches on both ranks, the weights are equal).
WEIGHTS_RUN = tuple(name for name in FIXTURES_RUN + REACH_RUN if name not in PRINTED_ONLY + ("tiny_gpt_config",))


def _class(source: str) -> cst.ClassDef:
    return cst.parse_module(source).body[0]


MODEL = """\
class Net(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.hidden_size = hidden
        self.rnn = nn.GRU(4, hidden)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x, h):
        return self.rnn(x, h)

    def zeros(self):
        return torch.zeros(1, 1, self.hidden_size, device=device)

    def like_weights(self, batch):
        weight = next(self.parameters()).data
        return weight.new(1, batch, self.hidden_size).zero_()

    def through_zeros(self, batch):
        return self.zeros()

    def encode(self, x):
        return self.rnn(x)[0]

    def scaled(self, batch):
        return self.scale * torch.zeros(batch)

    def weight_itself(self):
        weight = next(self.parameters())
        return weight * 2
"""


@pytest.mark.parametrize(
    "method, expected",
    [
        ("zeros", True), ("like_weights", True), ("through_zeros", True),
        ("encode", False), ("scaled", False), ("weight_itself", False), ("forward", False), ("missing", False),
    ],
)
def test_methods_that_compute_nothing_from_the_parameters(method, expected):
    """Plain attributes, a parameter's dtype and device, other such methods:
    nothing a gradient flows through. A layer, a parameter, or a parameter
    read as a tensor: something it does."""
    assert touches_no_parameter(_class(MODEL), method) is expected


PREDICTORS = """\
class Net(nn.Module):
    def predict(self, x):
        \"\"\"Scores.\"\"\"
        return self(x)

    def run(self, x, h):
        return self.forward(x, h)

    def swapped(self, x, h):
        return self(h, x)

    def softened(self, x):
        return self(x).softmax(-1)

    def defaulted(self, x, h=None):
        return self(x, h)
"""


@pytest.mark.parametrize("method, expected", [("predict", True), ("run", True), ("swapped", False), ("softened", False), ("defaulted", False)])
def test_methods_that_only_run_the_forward(method, expected):
    assert plain_forward(_class(PREDICTORS), method) is expected


def _migrated(path: Path) -> str:
    return migrate_source(path.read_text(), [("ddp", {})], str(path)).code


def test_configure_optimizers_trains_the_model_it_is_called_on():
    code = _migrated(CASES / "configure_optimizers_groups.py")
    wrap = "    if is_distributed():\n        model = DistributedDataParallel("
    assert code.index("model = TinyLM().to(device)") < code.index(wrap) < code.index("unwrap_model(model).configure_optimizers(")
    assert "sample = unwrap_model(model).generate(" in code


def test_a_method_that_computes_the_loss_through_parameters_stays_refused():
    result = migrate_source((CASES / "own_method_in_training.py").read_text(), [("ddp", {})], "own_method_in_training.py")
    assert [f.code for f in result.findings if f.code == "AM527" and not f.fixed] == ["AM527"]
    assert "DistributedDataParallel" not in result.code


@pytest.mark.parametrize("script", REACH_RUN + ("autoencoder_numpy_metrics", "seq2seq_two_optimizers"))
def test_reach_scripts_no_longer_refused_on_the_model_side(script):
    result = migrate_source((REACH / f"{script}.py").read_text(), [("ddp", {})], f"{script}.py")
    assert not [f for f in result.findings if f.code in ("AM520", "AM527") and not f.fixed]
    assert "DistributedDataParallel(" in result.code


# -- end to end ---------------------------------------------------------------------


def _final_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("epoch ", "final loss"))]


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    work = tmp_path_factory.mktemp("ddp-model-side")
    python, env = sys.executable, cpu_env()
    two = [python, "-m", "accelmigrate", "run", "--nproc-per-node", "2", "--force"]
    started, folders = {}, {}
    for name, source in [*((c, CASES / f"{c}.py") for c in FIXTURES_RUN), *((s, REACH / f"{s}.py") for s in REACH_RUN)]:
        original, migrated = work / f"{name}.original.py", work / f"{name}.py"
        shutil.copy(source, original)
        shutil.copy(source, migrated)
        applied = run_cli("apply", str(migrated), "--to", "ddp", cwd=work)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        plans = {
            "original": [python, str(RANK_WEIGHTS), "{folder}", str(original)],
            "plain": [python, str(RANK_WEIGHTS), "{folder}", str(migrated)],
            "ddp": [*two, str(RANK_WEIGHTS), "--", "{folder}", str(migrated)],
        }
        if name not in WEIGHTS_RUN + PRINTED_ONLY:
            del plans["ddp"]
        for kind, command in plans.items():
            folder = folders[name, kind] = work / f"{name}-{kind}"
            folder.mkdir()
            started[name, kind] = Launch(work, f"{name}-{kind}", [p.format(folder=folder) for p in command], env, folder)
    return {key: launch.wait() for key, launch in started.items()}, folders


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURES_RUN + REACH_RUN)
def test_migrated_runs_as_python_with_the_original_losses(launches, name):
    runs, _ = launches
    original, plain = runs[name, "original"], runs[name, "plain"]
    assert original.returncode == 0, original.describe()
    assert plain.returncode == 0, plain.describe()
    assert _final_lines(plain.stdout) and _final_lines(plain.stdout) == _final_lines(original.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("name", PRINTED_ONLY)
def test_two_ranks_print_the_one_process_losses(launches, name):
    runs, _ = launches
    original, two = runs[name, "original"], runs[name, "ddp"]
    assert two.returncode == 0, two.describe()
    assert _final_lines(two.stdout) and _final_lines(two.stdout) == _final_lines(original.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("name", WEIGHTS_RUN)
def test_two_ranks_end_with_the_one_process_weights(launches, name):
    """Wrapped after the last move (else DDP wraps parameters the move then
    leaves behind, or the move fails), the model its own method's optimizer
    trains (else each rank trains its own copy), `init_hidden` and the metric
    codes on the bare module (else an AttributeError on the wrapper)."""
    runs, folders = launches
    weights = assert_ranks_agree(runs[name, "ddp"], folders[name, "ddp"])
    (one_process,) = rank_weights(folders[name, "original"])
    assert largest_parameter_difference(one_process, weights) <= ONE_PROCESS_TOLERANCE
