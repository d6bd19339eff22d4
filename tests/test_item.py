"""The `item` codemod beyond its fixture pairs: what the migrated code does when
it runs (graphs freed, same numbers, tensor uses still working), check mode,
and the cases the analysis must get right (scopes, branches, later uses)."""

import json
import subprocess
import sys
import textwrap

import pytest

from accelmigrate.codemods.item import Item
from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES, run_python

PLAN = [("item", {})]


def migrate(source: str):
    return migrate_source(textwrap.dedent(source), PLAN, "train.py")


def codes(result) -> list[str]:
    return [f"{f.line}:{f.column} {f.code}" for f in result.findings]


# -- running the migrated code -------------------------------------------------------

# Keeps six losses with `retain_graph=True`, so that each kept loss keeps its
# saved activations alive; weak references count the activations still alive.
RETAINED = """\
import gc
import weakref

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
activations = []
losses = []
total = 0.0
history = []
for step in range(6):
    hidden = model[1](model[0](torch.randn(32, 16)))
    activations.append(weakref.ref(hidden))
    loss = model[2](hidden).pow(2).mean()
    optimizer.zero_grad()
    loss.backward(retain_graph=True)
    optimizer.step()
    losses.append(loss)
    total += loss
    history.append(loss)
del hidden, loss
gc.collect()
alive = sum(ref() is not None for ref in activations)
curve = torch.stack(history).mean()
print(f"mean {sum(losses) / len(losses):.4f} total {total:.4f} curve {curve:.4f}")
"""

# Runs scripts in one interpreter (one torch import) and reports, for each,
# its error, its output, the accumulators that still hold a graph, and `alive`.
DRIVER = """\
import contextlib, io, json, os, runpy, sys, traceback
import torch

def holds_graph(value, depth=0):
    if isinstance(value, torch.Tensor):
        return value.grad_fn is not None
    if depth < 4 and isinstance(value, (list, tuple, set)):
        return any(holds_graph(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, dict):
        return any(holds_graph(v, depth + 1) for v in value.values())
    return False

def lookup(namespace, dotted):
    head, *rest = dotted.split(".")
    value = namespace[head]
    for part in rest:
        value = getattr(value, part)
    return value

report = {}
for path, names in json.loads(sys.argv[1]).items():
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            namespace = runpy.run_path(path, run_name="__main__")
    except Exception:
        report[path] = {"error": traceback.format_exc(limit=2), "output": out.getvalue()}
        continue
    report[path] = {
        "output": out.getvalue(),
        "graphs": [n for n in names if holds_graph(lookup(namespace, n))],
        "alive": namespace.get("alive"),
    }
print("REPORT" + json.dumps(report))
"""

# Fixture cases that run as scripts, with the accumulators to inspect afterwards.
RUNNABLE = {
    "append_printed": ["losses"],
    "total_augassign": [],
    "dict_store": ["per_step", "by_phase"],
    "stack_later": ["step_losses", "epoch_means"],
    "gan": ["G_losses", "D_losses", "d_real_sum"],
    "trainer_class": ["trainer.train_losses", "trainer.val_history"],
    "amp_and_aliases": ["scaled_losses", "accumulated", "paired"],
    "global_step_function": ["running", "history"],
    "nonscalar_gradient": ["per_sample"],
    "logged_records": ["records", "pairs"],
}
# Fixture cases whose migrated script must print exactly what the original prints.
SAME_OUTPUT = ("returned_loss", "logged_records")


def run_driver(tmp_path, scripts: dict) -> dict:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    completed = run_python(driver, json.dumps(scripts), cwd=tmp_path, env={"PYTHONWARNINGS": "ignore"})
    assert completed.returncode == 0, completed.stderr
    line = next(line for line in completed.stdout.splitlines() if line.startswith("REPORT"))
    return json.loads(line[len("REPORT") :])


@pytest.mark.slow
def test_migrated_code_frees_graphs_and_prints_the_same_numbers(tmp_path):
    original = tmp_path / "original.py"
    migrated = tmp_path / "migrated.py"
    original.write_text(RETAINED)
    result = migrate_source(RETAINED, PLAN, "retained.py")
    assert [f.code for f in result.findings] == ["AM201", "AM201", "AM202"]
    migrated.write_text(result.code)
    report = run_driver(
        tmp_path, {str(original): ["losses", "total", "history"], str(migrated): ["losses", "total", "history"]}
    )
    before, after = report[str(original)], report[str(migrated)]
    assert "error" not in before and "error" not in after, (before, after)
    assert before["alive"] == 6 and before["graphs"] == ["losses", "total", "history"]
    assert after["alive"] == 0 and after["graphs"] == []
    assert after["output"] == before["output"]


@pytest.mark.slow
def test_migrated_fixtures_run_and_keep_no_graph_where_the_inputs_did(tmp_path):
    folder = FIXTURES / "item"
    migrated = {str(folder / f"{case}.expected.py"): names for case, names in RUNNABLE.items()}
    original = {str(folder / f"{case}.py"): names for case, names in RUNNABLE.items() if names}
    report = run_driver(tmp_path, {**migrated, **original})
    for path in migrated:
        outcome = report[path]
        assert "error" not in outcome, f"{path}: {outcome.get('error')}"
        assert outcome["graphs"] == [], f"{path} still keeps graphs in {outcome['graphs']}"
    for path in original:  # they kept graphs, or crashed on them (np.mean over tensors that require grad)
        outcome = report[path]
        assert "error" in outcome or outcome["graphs"], f"{path} kept no graph before migration"


# -- modes and cheap guarantees ------------------------------------------------------


def test_check_mode_reports_the_same_findings_and_changes_nothing():
    source = (FIXTURES / "item" / "trainer_class.py").read_text()
    applied = migrate_source(source, PLAN, "t.py")
    checked = migrate_source(source, PLAN, "t.py", check_only=True)
    assert checked.code == source
    assert checked.findings == applied.findings
    assert [f.fixed for f in checked.findings] == [True, True, False]


def test_a_file_without_backward_is_not_even_parsed():
    assert not Item.wants("losses.append(loss)\n")
    assert migrate("for x in data:\n    losses.append(loss(x))\n").findings == []


def test_the_codemod_does_not_import_torch():
    code = (
        "import sys\n"
        "import libcst as cst\n"
        "from libcst.codemod import CodemodContext\n"
        "from libcst.metadata import MetadataWrapper\n"
        "from accelmigrate.codemods.item import Item\n"
        f"source = open({str(FIXTURES / 'item' / 'gan.py')!r}).read()\n"
        "wrapper = MetadataWrapper(cst.parse_module(source))\n"
        "codemod = Item(CodemodContext(wrapper=wrapper))\n"
        "wrapper.visit(codemod)\n"
        "assert codemod.findings\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr


# -- the analysis -----------------------------------------------------------------


def test_a_loss_is_a_loss_only_in_the_function_that_backpropagates_it():
    result = migrate("""
        def train(model, data, losses):
            history = []
            for x in data:
                loss = model(x).sum()
                loss.backward()
                history.append(loss)
            print(sum(history))

        def evaluate(model, data):
            scores = []
            for x in data:
                loss = model(x).sum()
                scores.append(loss)
            return scores
        """)
    assert "history.append(loss.item())" in result.code
    assert "scores.append(loss)\n" in result.code
    assert codes(result) == ["7:9 AM201"]


def test_a_tensor_use_of_the_accumulator_gets_detach():
    result = migrate("""
        total = 0
        for x in data:
            loss = model(x).mean()
            loss.backward()
            total += loss
        print(total.item())
        """)
    assert "total += loss.detach()" in result.code
    assert codes(result) == ["6:5 AM202"]


def test_a_returned_accumulator_is_followed_into_its_callers():
    source = """
        import torch

        def epoch(model, data):
            losses = []
            for x in data:
                loss = model(x).mean()
                loss.backward()
                losses.append(loss)
            return losses

        curve = epoch(model, data)
        {use}
    """
    as_numbers = migrate(source.format(use='print(f"{max(curve):.3f}")'))
    as_tensors = migrate(source.format(use="print(torch.stack(curve).cpu())"))
    assert "losses.append(loss.item())" in as_numbers.code
    assert "losses.append(loss.detach())" in as_tensors.code


def test_elements_used_as_tensors_in_a_comprehension_get_detach():
    result = migrate("""
        kept = []
        for x in data:
            loss = model(x).mean()
            loss.backward()
            kept.append(loss)
        print([k.item() for k in kept])
        """)
    assert "kept.append(loss.detach())" in result.code


def test_a_name_detached_only_in_a_branch_is_reported_not_rewritten():
    source = """
        kept = []
        for x in data:
            loss = model(x).mean()
            loss.backward()
            if verbose:
                loss = loss.item()
            kept.append(loss)
        print(sum(kept))
        """
    result = migrate(source)
    assert result.code == textwrap.dedent(source)
    assert codes(result) == ["8:5 AM203"]


def test_a_loss_detached_before_it_is_stored_is_left_alone():
    source = """
        kept = []
        for x in data:
            loss = model(x).mean()
            loss.backward()
            loss = loss.item()
            kept.append(loss)
        print(sum(kept))
        """
    result = migrate(source)
    assert result.code == textwrap.dedent(source) and result.findings == []


def test_a_loss_that_may_not_be_a_single_number_gets_detach():
    result = migrate("""
        kept = []
        for x in data:
            loss = model(x).mean()
            (loss * weights).sum().backward()
            kept.append(loss)
        print(sum(kept))
        """)
    assert "kept.append(loss.detach())" in result.code


def test_loop_values_unrelated_to_the_loss_are_not_touched():
    # R is a plain number while returns are built, and a tensor later on
    source = """
        def finish(policy, optimizer, rewards, saved):
            R = 0
            returns = []
            for r in rewards[::-1]:
                R = r + 0.99 * R
                returns.insert(0, R)
            policy_loss = []
            for log_prob, R in zip(saved, torch.tensor(returns)):
                policy_loss.append(-log_prob * R)
            total = torch.cat(policy_loss).sum()
            total.backward()
            print(sum(returns))
        """
    result = migrate(source)
    assert result.code == textwrap.dedent(source) and result.findings == []


def test_an_unrelated_method_call_with_the_loss_is_not_a_store():
    source = """
        for step, x in enumerate(data):
            loss = model(x).mean()
            loss.backward()
            writer.add_scalar("loss", loss, step)
            logger.info("loss %s", loss)
        """
    result = migrate(source)
    assert result.code == textwrap.dedent(source) and result.findings == []


def test_accumulation_written_as_a_reassignment_in_a_method():
    result = migrate("""
        class Trainer:
            def __init__(self):
                self.running = 0.0

            def fit(self, data):
                for x in data:
                    loss = self.model(x).mean()
                    loss.backward()
                    self.running = self.running + loss
                print("%.3f" % self.running)
        """)
    assert "self.running = self.running + loss.item()" in result.code
    assert codes(result) == ["10:13 AM201"]


@pytest.mark.slow
def test_detached_returns_and_records_print_the_same_numbers(tmp_path):
    folder = FIXTURES / "item"
    pairs = [(str(folder / f"{case}.py"), str(folder / f"{case}.expected.py")) for case in SAME_OUTPUT]
    report = run_driver(tmp_path, {path: [] for pair in pairs for path in pair})
    for original, migrated in pairs:
        before, after = report[original], report[migrated]
        assert "error" not in before and "error" not in after, (before, after)
        assert before["output"] and after["output"] == before["output"]


# -- losses returned by a function, losses in a record -----------------------------------


def test_a_loss_returned_by_a_step_function_is_detached_at_the_call():
    result = migrate("""
        import torch

        def train_step(model, optimizer, x):
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            return loss

        def main(model, optimizer, batches):
            losses = []
            for x in batches:
                losses.append(train_step(model, optimizer, x))
            print(sum(losses) / len(losses))
    """)
    assert "losses.append(train_step(model, optimizer, x).item())" in result.code
    assert codes(result) == ["14:9 AM201"]


def test_a_function_that_may_return_none_is_not_detached_at_the_call():
    result = migrate("""
        def train_step(model, optimizer, x):
            if x is None:
                return None
            loss = model(x).sum()
            loss.backward()
            return loss

        def main(model, optimizer, batches):
            losses = []
            for x in batches:
                losses.append(train_step(model, optimizer, x))
            print(len(losses))
    """)
    assert ".item()" not in result.code and ".detach()" not in result.code
    assert [f.code for f in result.findings] == ["AM203"]


def test_a_record_of_losses_is_detached_inside_its_literal():
    """`record = {"loss": loss}` holds a loss; `record.detach()` would fail on a dict."""
    result = migrate("""
        def train(model, optimizer, batches):
            history = []
            for step, x in enumerate(batches):
                loss = model(x).mean()
                loss.backward()
                optimizer.step()
                record = {"step": step, "loss": loss}
                history.append(record)
            print([r["loss"] for r in history])
    """)
    assert 'record = {"step": step, "loss": loss.item()}' in result.code
    assert "record.detach()" not in result.code and "record.item()" not in result.code
    assert codes(result) == ["9:9 AM201"]


def test_a_loss_unpacked_from_a_returned_tuple_is_detached():
    result = migrate("""
        def train_step(model, optimizer, x, y):
            output = model(x)
            loss = (output - y).pow(2).mean()
            loss.backward()
            optimizer.step()
            return loss, output.argmax(1)

        def main(model, optimizer, loader):
            total = 0.0
            for x, y in loader:
                loss, predicted = train_step(model, optimizer, x, y)
                total += loss
            print(total / len(loader))
    """)
    assert "total += loss.item()" in result.code
    assert codes(result) == ["13:9 AM201"]


def test_a_method_a_subclass_overrides_is_not_trusted_to_return_a_loss():
    result = migrate("""
        class Trainer:
            def step(self, x):
                loss = self.model(x).mean()
                loss.backward()
                return loss

            def fit(self, batches):
                history = []
                for x in batches:
                    history.append(self.step(x))
                print(sum(history))

        class Probe(Trainer):
            def step(self, x):
                return 0.0
    """)
    assert ".item()" not in result.code
