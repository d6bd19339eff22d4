"""The script model and the ast pre-check, on their own.

fixtures/script/ holds small scripts in the shapes of real ones (a flat
tutorial, `train(args, model, device, train_loader, optimizer, epoch)`, a
trainer class, a GAN, an RNN of 2018, aliased imports, a user's own
DataLoader class). The last tests prove that the pre-check never rejects a
file that a codemod would change or report on, over every fixture.
"""

import re
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, QualifiedNameSource

from accelmigrate.codemods import all_codemods, resolve
from accelmigrate.codemods._base import walk as _walk
from accelmigrate.codemods.script import RULES, ScriptModel, precheck, words_that_may_apply
from accelmigrate.engine import migrate as engine
from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES

SCRIPT_FIXTURES = FIXTURES / "script"
VALUES = {"accumulate": {"value": "4"}, "batch-scale": {"value": "2"}}  # words that need one


def model_of(name: str) -> ScriptModel:
    return ScriptModel.of(cst.parse_module((SCRIPT_FIXTURES / name).read_text()))


def facts_of(name: str):
    return precheck((SCRIPT_FIXTURES / name).read_text())


def names(entities) -> list[str]:
    return [e.name for e in entities]


# -- the script model ------------------------------------------------------------------


def test_flat_tutorial_has_one_step_at_module_level():
    model = model_of("flat_tutorial.py")
    (step,) = model.training_steps
    assert (step.function.name, step.loss, step.optimizers, step.model_names) == ("<module>", "loss", ["optimizer"], ["net"])
    inner, outer = step.loops
    assert inner.loader is not None and inner.loader.name == "trainloader" and inner.line == 19
    assert outer.header == "for epoch in range(2)" and outer.loader is None
    assert model.entry.main_guard is None and model.entry.is_flat
    assert names(model.devices) == ["device"] and model.devices[0].kind == "torch.device"
    assert [(d.name, d.made_by) for d in model.datasets] == [("trainset", "torchvision.datasets.FashionMNIST")]


def test_train_function_receives_model_device_loader_and_optimizer():
    model = model_of("train_args_device.py")
    (step,) = model.steps_in("train")
    assert (step.loss, step.optimizers, step.model_names, step.line) == ("loss", ["optimizer"], ["model"], 31)
    # followed through train()'s parameters to what main() passes
    assert step.optimizer_steps[0].entity.made_by == "torch.optim.Adadelta"
    assert step.models[0].made_by == "Net" and step.loops[0].loader.name == "train_loader"
    assert [loop.header for loop in step.called_in_loops] == ["for epoch in range(1, args.epochs + 1)"]
    train = model.function("train")
    assert train.parameters == ["args", "model", "device", "train_loader", "optimizer", "epoch"]
    (site,) = train.callers
    assert site.caller.name == "main" and site.line == 66
    assert {p: cst.Module([]).code_for_node(e) for p, e in site.arguments.items()}["optimizer"] == "optimizer"
    assert sorted(train.scope.bindings) == sorted(
        ["args", "model", "device", "train_loader", "optimizer", "epoch", "batch_idx", "data", "target", "output", "loss"]
    )
    assert [(d.name, d.kind, d.scope.name) for d in model.devices if d.kind != "flag"] == [
        ("device", "parameter", "train"), ("device", "parameter", "test"), ("device", "torch.device", "main"),
    ]
    assert [(r.kind, r.scope.name) for r in model.evaluation] == [("eval", "test"), ("no_grad", "test")]
    assert names(model.schedulers) == ["scheduler"] and names(model.loaders) == ["train_loader", "test_loader"]
    assert model.entry.guard_line == 71 and model.entry.called_from_guard[0] == "main" and not model.entry.is_flat


def test_trainer_class_keeps_everything_on_self():
    model = model_of("trainer_class.py")
    (step,) = model.training_steps
    assert (step.function.name, step.loss, step.optimizers, step.model_names) == (
        "Trainer.train_step", "loss", ["self.optimizer"], ["self.model"],
    )
    assert step.optimizer_steps[0].entity.made_by == "torch.optim.AdamW"
    assert step.loops == [] and [loop.line for loop in step.called_in_loops] == [36, 35]
    assert [(d.name, d.kind) for d in model.devices] == [("device", "parameter"), ("self.device", "torch.device")]
    assert [(r.kind, r.scope.name) for r in model.evaluation] == [("decorator", "Trainer.evaluate"), ("eval", "Trainer.evaluate")]
    # `Trainer(build_model(32))`: the model comes from a function of the file that returns one
    assert [(m.name, m.kind) for m in model.models] == [("self.model", "model")]


def test_gan_has_three_backwards_two_optimizers_and_two_trained_models():
    model = model_of("gan_two_optimizers.py")
    assert [(s.loss, s.optimizers) for s in model.training_steps] == [
        ("errD_real", ["optimizerD"]), ("errD_fake", ["optimizerD"]), ("errG", ["optimizerG"]),
    ]
    # the fake batch is detached for the discriminator's loss: only netD's forward trains there
    assert [s.model_names for s in model.training_steps] == [["netD"], ["netD"], ["netD", "netG"]]
    assert names(model.models) == ["netG", "netD"] and names(model.trained_models) == ["netD", "netG"]
    assert len(model.layers) == 2  # self.main of each class: parts of a model, not models
    assert model.training_steps[0].loops[0].loader.name == "data"  # the loader passed to run()


def test_rnn_2018_flat_script_with_a_train_function():
    model = model_of("rnn_2018.py")
    (step,) = model.training_steps
    assert (step.function.name, step.loss, step.optimizers, step.model_names) == ("train", "loss", ["optimizer"], ["model"])
    assert step.loops[0].header.startswith("for i in range(0, train_data.size(0) - 1, bptt)")
    assert model.entry.is_flat and "train" in model.entry.runs_at_import and "evaluate" not in model.entry.runs_at_import
    assert [(r.kind, r.model) for r in model.evaluation] == [("eval", "model")]
    assert names(model.layers) == ["self.encoder", "self.rnn", "self.decoder"]


def test_aliases_resolve_to_torch_qualified_names():
    model = model_of("aliases.py")
    assert [(e.kind, e.name, e.made_by) for e in model.entities if not e.layer] == [
        ("dataset", "dataset", "torch.utils.data.TensorDataset"),
        ("loader", "loader", "torch.utils.data.DataLoader"),
        ("model", "net", "Regressor"),
        ("optimizer", "opt", "torch.optim.Adam"),
        ("scheduler", "sched", "torch.optim.lr_scheduler.StepLR"),
    ]
    (step,) = model.training_steps
    assert (step.loss, step.optimizers, step.model_names) == ("err", ["opt"], ["net"])
    imports = {b.name: b.qualified for b in model.imports}
    assert imports == {
        "th": "torch", "nn": "torch.nn", "tud": "torch.utils.data", "O": "torch.optim", "Sched": "torch.optim.lr_scheduler.StepLR",
    }


def test_own_dataloader_class_is_not_torch_s():
    model = model_of("own_dataloader.py")
    assert model.loaders == [] and model.training_steps == []
    facts = facts_of("own_dataloader.py")
    assert facts.dataloader_calls == 0 and not facts.imports_torch
    assert words_that_may_apply(facts, list(all_codemods())) == []


def _calls(model: ScriptModel) -> dict[str, cst.Call]:
    """The module's calls by the code of what they call."""
    return {model.module.code_for_node(n.func): n for n in _walk(model.module) if isinstance(n, cst.Call)}


@pytest.mark.parametrize(
    "code, loader, expected",
    [
        ("import torch.utils.data as tud\ntud.DataLoader(d)\n", "tud.DataLoader", True),
        ("from torch.utils.data import DataLoader as DL\nDL(d)\n", "DL", True),
        ("from torch.utils.data import *\nDataLoader(d)\n", "DataLoader", True),  # the star import is torch's only
        ("from torch.utils.data import *\nfrom mylib import *\nDataLoader(d)\n", "DataLoader", False),  # mylib's, maybe
        ("from torch.utils.data import *\nclass DataLoader: pass\nDataLoader(d)\n", "DataLoader", False),  # the file's own
        ("class DataLoader: pass\nDataLoader(d)\n", "DataLoader", False),
    ],
)
def test_dataloader_calls_are_torch_s_by_any_spelling(code, loader, expected):
    model = ScriptModel.of(cst.parse_module(code))
    assert model.is_dataloader(_calls(model)[loader]) is expected


def test_optimizer_calls_and_factories():
    model = ScriptModel.of(cst.parse_module(
        "import torch.optim as O\nfrom timm.optim import create_optimizer\nfrom torch.optim.lr_scheduler import StepLR\n"
        "a = O.SGD(m.parameters(), lr=0.1)\nb = create_optimizer(args, m)\nc = StepLR(a, 1)\nd = SGD(m.parameters())\n"
    ))
    calls = _calls(model)
    assert [model.makes_optimizer(calls[f]) for f in ("O.SGD", "create_optimizer", "StepLR", "SGD")] == [True, True, False, False]
    # a factory's arguments are not an optimizer's (ddp reads the parameters an optimizer class is given)
    assert model.makes_optimizer(calls["O.SGD"], classes_only=True)
    assert not model.makes_optimizer(calls["create_optimizer"], classes_only=True)


def test_kind_of_names_where_they_are_used():
    model = model_of("train_args_device.py")
    train = model.function("train").node
    calls = [n for n in _walk(train) if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)]
    step_call = next(c for c in calls if c.func.attr.value == "step")
    assert model.is_optimizer(step_call.func.value) and model.kind_of(step_call.func.value) == "optimizer"
    train_call = next(c for c in calls if c.func.attr.value == "train")
    assert model.is_model(train_call.func.value)


@pytest.mark.parametrize("path", sorted([*SCRIPT_FIXTURES.glob("*.py"), *(FIXTURES / "scripts").glob("*.py")]), ids=lambda p: p.stem)
def test_qualified_names_cover_libcst_s(path: Path):
    """Every import or builtin qualified name LibCST gives a callee, ours gives too."""
    module = cst.parse_module(path.read_text())
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    theirs = wrapper.resolve(QualifiedNameProvider)
    model = ScriptModel.of(wrapper)
    calls = [n for n in _walk(module) if isinstance(n, cst.Call)]
    assert calls
    for call in calls:
        found = theirs.get(call.func, ())
        found = found() if callable(found) else found  # LibCST resolves some lazily
        expected = {q.name for q in found if q.source in (QualifiedNameSource.IMPORT, QualifiedNameSource.BUILTIN)}
        expected.discard("builtins.None")  # what LibCST names the attribute of a parenthesised expression
        assert expected <= model.qualified_names(call.func), cst.Module([]).code_for_node(call.func)


# -- the pre-check -------------------------------------------------------------------------


def test_precheck_facts_of_a_flat_tutorial():
    facts = facts_of("flat_tutorial.py")
    assert facts.imports_torch and facts.dataloader_calls == 1 and facts.backward_calls == 1
    assert facts.training_steps == (24,) and not facts.main_guard and facts.cuda_strings == 1
    assert facts.torch_save and not facts.data_parallel and not facts.empty_cache and not facts.mixed_precision
    assert facts.uses({"torch.optim.SGD", "torch.nn.CrossEntropyLoss", "torch.cuda.is_available"})


def test_precheck_resolves_aliases_and_sees_no_grad():
    facts = facts_of("aliases.py")
    assert facts.calls_to({"torch.optim.Adam"}) == 1 and facts.uses({"torch.optim.lr_scheduler.StepLR"})
    assert facts.main_guard and facts.has_training_step
    assert facts_of("train_args_device.py").no_grad


@pytest.mark.parametrize(
    "code, placements",
    [
        ('x.to("cuda")', 1), ('torch.device("cuda:1")', 1), ('f"cuda:{rank}"', 1), ('"cuda:%d" % i', 1),
        ('"cuda:{}".format(i)', 1), ('"cuda:" + str(i)', 1), ('parser.add_argument("--device", default="cuda")', 1),
        ('x.device.type == "cuda"', 0), ('"cuda" != kind', 0), ('torch.autocast(device_type="cuda")', 0),
        ('backends = ["cudnn", "cuda_graph"]', 0), ('print("cuda is not available")', 0),
    ],
)
def test_precheck_counts_only_strings_that_may_place_on_cuda(code, placements):
    assert precheck(code + "\n").cuda_strings == placements


def test_precheck_keeps_device_only_for_what_it_rewrites_or_reports():
    kept = ["x.cuda()", "torch.cuda.synchronize()", "torch.cuda.set_device(0)", "t = torch.cuda.FloatTensor(2)",
            "ok = torch.cuda.is_available()", "from torch.cuda import *\nsynchronize()", 'x.to("cuda")']
    dropped = ["torch.cuda.manual_seed(0)", "n = torch.cuda.memory_allocated()", 'if x.device.type == "cuda": pass']
    for code in kept + dropped:
        facts = precheck("import torch\n" + code + "\n")
        assert (words_that_may_apply(facts, ["device"]) == ["device"]) == (code in kept), code


def test_precheck_rejects_what_no_codemod_can_match():
    source = '"""A library module: defines layers, trains nothing."""\nimport torch\n\n\ndef scale(x):\n    return torch.relu(x) * 2\n'
    assert words_that_may_apply(precheck(source), list(all_codemods())) == []
    # a word with no rule is always kept
    assert words_that_may_apply(precheck(source), ["no-such-rule"]) == ["no-such-rule"]


def test_precheck_chains_what_earlier_words_write():
    """workers writes `torch.cuda.is_available()`: device may then find CUDA."""
    source = "import torch\nloader = torch.utils.data.DataLoader([1, 2])\n"
    assert words_that_may_apply(precheck(source), ["device"]) == []
    assert words_that_may_apply(precheck(source), ["workers", "device"]) == ["workers", "device"]


def all_fixture_files():
    return sorted(p for p in FIXTURES.glob("*/*.py") if not p.name.endswith(".expected.py"))


@pytest.fixture
def rules_off(monkeypatch):
    """The engine runs every selected word, whatever the pre-check says: what
    a rejected word would have done is then seen."""
    monkeypatch.setattr(engine, "words_that_may_apply", lambda facts, words: list(words))


def test_precheck_never_rejects_a_file_a_codemod_touches(rules_off):
    """For every fixture and every word alone: when the pre-check rejects the
    word, its codemod (after the words it requires) changes and reports nothing."""
    missed, checked = [], 0
    for path in all_fixture_files():
        source = path.read_text()
        facts = precheck(source)
        rejected = [word for word in all_codemods() if not words_that_may_apply(facts, [word])]
        if rejected:
            # check mode runs each codemod on its prerequisites' output, as apply would
            result = migrate_source(source, [(w, VALUES.get(w, {})) for w in rejected], str(path), check_only=True)
            missed += [f"{path.relative_to(FIXTURES)}:{f.line} {f.code} ({f.word})" for f in result.findings if f.word in rejected]
            checked += len(rejected)
    assert not missed
    assert checked > 100  # the proof ran: many (fixture, word) pairs are rejected


_DIRECTIVE = re.compile(r"^# fixture-to:\s*(\S+)\s*$", re.MULTILINE)


def test_precheck_never_rejects_a_word_of_a_fixture_s_own_combination(rules_off):
    """The fixtures that name several words: a rejected word reports nothing
    in the real run, after the words before it rewrote the file."""
    missed, checked = [], 0
    for path in all_fixture_files():
        source = path.read_text()
        directive = _DIRECTIVE.search(source[:2000])
        if directive is None or "," not in directive.group(1):
            continue
        plan = [(w.partition("=")[0], {"value": w.partition("=")[2]} if "=" in w else {}) for w in directive.group(1).split(",")]
        words = [cls.word for cls, _ in resolve(dict(plan))]
        rejected = set(words) - set(words_that_may_apply(precheck(source), words))
        if rejected:
            result = migrate_source(source, plan, str(path))
            missed += [f"{path.name}:{f.line} {f.code}" for f in result.findings if f.word in rejected]
            checked += len(rejected)
    assert not missed


def test_names_the_distributed_codemods_add_are_theirs():
    """The pre-check's copies of the names ddp and fsdp add (a file that has
    one already gets their AM530) are the codemods' own lists."""
    from accelmigrate.codemods import ddp, fsdp
    from accelmigrate.codemods.script.precheck import DDP_ADDED_NAMES, FSDP_ADDED_NAMES

    assert DDP_ADDED_NAMES == set(ddp.ADDED_NAMES) and FSDP_ADDED_NAMES == fsdp.ADDED_SHARDING_NAMES


def test_rules_off_lets_a_rejected_word_run(rules_off, monkeypatch):
    """What the two proofs above rely on: with `rules_off`, a word that its
    rule rejects still runs and reports."""
    monkeypatch.setitem(RULES, "empty-cache", lambda facts: False)
    source = "import torch\n\nfor step in range(3):\n    torch.cuda.empty_cache()\n"
    assert words_that_may_apply(precheck(source), ["empty-cache"]) == []
    assert [f.code for f in migrate_source(source, [("empty-cache", {})], check_only=True).findings] == ["AM210"]


# -- scopes and cost --------------------------------------------------------------------


def test_scope_of_code_directly_in_a_body_is_the_body_s_scope():
    source = "def train(model, lr=1 + 2):\n    loss = model(1)\n    loss.backward()\n\n\nsquare = lambda x: x * x\n"
    model = ScriptModel.of(cst.parse_module(source))
    function = model.function("train").node
    line = function.body.body[0]
    assert model.scope_of(line).name == "train" and model.scope_of(function.body).name == "train"
    assert model.function_at(line) is model.function("train")
    assert model.scope_of(function).name == "<module>"  # the def statement itself runs in the module
    assert model.scope_of(function.params.params[1].default).name == "<module>"  # a default is evaluated outside
    (assign,) = model.module.body[1].body
    assert model.scope_of(assign.value.body).kind == "lambda"


FLAT_COPY = """
loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
model = torch.nn.Linear(4, 1).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    output = model(x.cuda())
    loss = torch.nn.functional.mse_loss(output, y.cuda())
    loss.backward()
    optimizer.step()
"""
FLAT_HEADER = "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"


def _nodes_read(monkeypatch, copies: int) -> int:
    """How many nodes the model's analyses read for a flat script of `copies`
    copies of one training block (the same names bound again each time)."""
    from accelmigrate.codemods.script import steps, uses

    read = []
    real_attached, real_is_read = steps._attached, uses.Uses.is_read

    def attached(expression):
        for node in real_attached(expression):
            read.append(1)
            yield node

    def is_read(self, name):
        read.append(1)
        return real_is_read(self, name)

    monkeypatch.setattr(steps, "_attached", attached)
    monkeypatch.setattr(uses.Uses, "is_read", is_read)
    model = ScriptModel.of(cst.parse_module(FLAT_HEADER + FLAT_COPY * copies))
    assert len(model.training_steps) == copies
    found = uses.uses_of(model)
    for binding in model.module_scope.bindings["model"]:
        found.reads("model", binding.scope)
    return len(read)


def test_a_flat_script_repeating_one_block_costs_in_proportion(monkeypatch):
    """Each backward's models, and the reads of each binding, are found
    without going over every other copy's assignments again."""
    small, large = _nodes_read(monkeypatch, 10), _nodes_read(monkeypatch, 40)
    assert large <= 4.5 * small


def _function_copies(copies: int) -> str:
    """`copies` training functions, each with its own model and optimizer."""
    block = """
def train{i}(loader):
    model{i} = torch.nn.Linear(4, 1)
    optimizer{i} = torch.optim.SGD(model{i}.parameters(), lr=0.1)
    for x, y in loader:
        optimizer{i}.zero_grad()
        torch.nn.functional.mse_loss(model{i}(x), y).backward()
        optimizer{i}.step()
"""
    return FLAT_HEADER + "".join(block.format(i=i) for i in range(copies))


@pytest.mark.parametrize("word", ["ddp", "fsdp"])
def test_each_optimizer_s_models_are_found_once_whatever_the_number_of_models(word, monkeypatch):
    """Every model asks which models each optimizer trains: answered once
    per optimizer, not once per (model, optimizer) pair."""
    from accelmigrate.codemods._ddp.bare_models import BareModelWrapping

    asked = []
    real = BareModelWrapping._find_models_trained_by
    monkeypatch.setattr(BareModelWrapping, "_find_models_trained_by", lambda self, call: asked.append(call) or real(self, call))
    plan = [(cls.word, options) for cls, options in resolve({word: {}})]
    migrate_source(_function_copies(12), plan, "train.py", check_only=True)
    assert len(asked) == len(set(map(id, asked))) == 12


def test_each_loader_binding_is_judged_once_for_its_length(monkeypatch):
    """A flat script rebinds `loader` in every copy and each loop may read
    every binding: whether a binding has a length is decided once."""
    from accelmigrate.codemods.script import accumulate_facts

    decided = []
    real = accumulate_facts._LengthlessBindings._decide
    monkeypatch.setattr(accumulate_facts._LengthlessBindings, "_decide", lambda self, b: decided.append(b) or real(self, b))
    plan = [(cls.word, options) for cls, options in resolve({"accumulate": {"value": "2"}})]
    migrate_source(FLAT_HEADER + FLAT_COPY * 20, plan, "train.py", check_only=True)
    assert 0 < len(decided) == len(set(map(id, decided))) <= 20
