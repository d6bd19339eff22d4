"""modernize: pre-0.4 idioms rewritten so that old scripts run on today's torch.

The fixture pairs (fixtures/modernize/) show each rewrite and each refusal;
here: migrated scripts run where the originals crash, and print what the
same script modernised by hand prints; and the facts about torch the
rewrites rely on hold for the installed torch.
"""

import inspect
import re
import warnings

import pytest
import torch

from accelmigrate.codemods._modernize import init_names, loss_arguments
from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES, SCRIPTS, run_python

MODERNIZE = [("modernize", {})]
NUMBER = re.compile(r"-?\d+\.\d+")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}

# fixtures/scripts/legacy_mnist_2018.py, modernised by hand as its author
# would for PyTorch 0.4: .item(), no Variable, torch.no_grad(), reduction=.
BY_HAND = '''
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument('--epochs', type=int, default=2)
parser.add_argument('--batch-size', type=int, default=16)
parser.add_argument('--lr', type=float, default=0.05)
args = parser.parse_args()

torch.manual_seed(1)
images = torch.randn(128, 1, 8, 8)
labels = (images.mean(dim=(1, 2, 3)) > 0).long() + 2 * (images[:, :, :4].mean(dim=(1, 2, 3)) > 0).long()
train_loader = DataLoader(TensorDataset(images[:96], labels[:96]), batch_size=args.batch_size, shuffle=True)
test_loader = DataLoader(TensorDataset(images[96:], labels[96:]), batch_size=args.batch_size)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, kernel_size=3)
        self.fc = nn.Linear(4 * 3 * 3, 4)
        nn.init.xavier_uniform_(self.fc.weight)
        nn.init.constant_(self.fc.bias, 0)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return F.log_softmax(self.fc(x.view(-1, 4 * 3 * 3)), dim=1)


model = Net()
optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.5)


def train(epoch):
    model.train()
    total = 0
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        total += loss.item()
        if batch_idx % 2 == 0:
            print('train epoch {} batch {} loss {:.8f}'.format(epoch, batch_idx, loss.item()))
    print('train epoch {} mean loss {:.8f}'.format(epoch, total / len(train_loader)))


def test():
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print('test loss {:.8f} correct {}'.format(test_loss, correct))


for epoch in range(1, args.epochs + 1):
    train(epoch)
    test()
'''


def migrated(path, tmp_path):
    result = migrate_source(path.read_text(encoding="utf-8"), MODERNIZE, str(path))
    target = tmp_path / path.name
    target.write_text(result.code, encoding="utf-8")
    return target, result


def test_legacy_mnist_crashes_before_and_matches_the_hand_modernised_script_after(tmp_path):
    original = run_python(SCRIPTS / "legacy_mnist_2018.py", env=ONE_THREAD)
    assert original.returncode != 0 and "invalid index of a 0-dim tensor" in original.stderr

    script, result = migrated(SCRIPTS / "legacy_mnist_2018.py", tmp_path)
    assert {f.code for f in result.findings} == {"AM220", "AM221", "AM222", "AM223", "AM224", "AM225"}
    assert all(f.fixed for f in result.findings)
    after = run_python(script, env=ONE_THREAD)
    assert after.returncode == 0, after.stderr
    assert "Warning" not in after.stderr  # no deprecated argument or alias left

    reference = tmp_path / "by_hand.py"
    reference.write_text(BY_HAND, encoding="utf-8")
    expected = run_python(reference, env=ONE_THREAD)
    assert expected.returncode == 0, expected.stderr
    assert [NUMBER.sub("#", line) for line in after.stdout.splitlines()] == [
        NUMBER.sub("#", line) for line in expected.stdout.splitlines()
    ]
    got, want = NUMBER.findall(after.stdout), NUMBER.findall(expected.stdout)
    assert len(got) == len(want) >= 10
    assert [float(a) for a in got] == pytest.approx([float(b) for b in want], abs=1e-6)


RUNNABLE = ["gan_2018", "word_language_model", "flat_script", "evaluation_loops", "aliases_and_imports"]


@pytest.mark.parametrize("case", RUNNABLE)
def test_migrated_fixture_runs_where_the_original_crashes(case, tmp_path):
    source = FIXTURES / "modernize" / f"{case}.py"
    before = run_python(source, env=ONE_THREAD)
    assert before.returncode != 0
    assert "0-dim tensor" in before.stderr or "iteration over a 0-d tensor" in before.stderr
    after = run_python(FIXTURES / "modernize" / f"{case}.expected.py", env=ONE_THREAD)
    assert after.returncode == 0, after.stderr


def test_refused_region_keeps_the_backward_that_follows_working():
    """Wrapping that loop in no_grad would make `penalty.backward()` fail."""
    after = run_python(FIXTURES / "modernize" / "flat_script_escape.expected.py", env=ONE_THREAD)
    assert after.returncode == 0, after.stderr


# -- the facts about torch the rewrites rely on ------------------------------------------------


def test_variable_detaches_as_the_rewrites_say():
    from torch.autograd import Variable

    weight = torch.ones(3, requires_grad=True)
    computed = weight * 2
    assert Variable(computed).grad_fn is None and not Variable(computed).requires_grad  # = computed.detach()

    base = torch.zeros(3)
    leaf = Variable(base, requires_grad=True)
    rewritten = base.detach().requires_grad_()
    for made in (leaf, rewritten):
        assert made.is_leaf and made.requires_grad and made is not base
        assert made.data_ptr() == base.data_ptr()
    assert not base.requires_grad  # the original tensor keeps its flag in both

    assert isinstance(base, Variable) and type(base) != Variable  # why `type(h) == Variable` is rewritten
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert not Variable(base, volatile=True).requires_grad  # volatile does nothing


def test_one_number_reads_raise_today():
    loss = torch.nn.functional.mse_loss(torch.zeros(2), torch.ones(2))
    with pytest.raises(IndexError, match="0-dim"):
        loss.data[0]
    assert loss.dim() == 0 and loss.item() == 1.0


@pytest.mark.parametrize("size_average", [True, False, None])
@pytest.mark.parametrize("reduce", [True, False, None])
def test_reduction_table_is_torchs(size_average, reduce):
    from torch.nn import _reduction

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _reduction.legacy_get_string(size_average, reduce)
    assert loss_arguments._legacy_reduction(size_average, reduce) == expected


def test_loss_signatures_match_the_installed_torch():
    def leading(callable_):
        names = list(inspect.signature(callable_).parameters)
        return min(names.index(n) for n in ("size_average", "reduce", "reduction") if n in names)

    for name, count in loss_arguments.FUNCTIONAL_LOSSES.items():
        assert leading(getattr(torch.nn.functional, name)) == count, name
    for name, count in loss_arguments.LOSS_CLASSES.items():
        assert leading(getattr(torch.nn, name)) == count, name


def test_deprecated_initialisers_are_torchs_aliases():
    source = inspect.getsource(torch.nn.init)
    for name in init_names.DEPRECATED_INIT:
        assert f"{name} = _make_deprecate({name}_)" in source, name
    weight = torch.empty(3, 3)
    with pytest.warns(FutureWarning, match="xavier_uniform_"):
        torch.nn.init.xavier_uniform(weight)


# -- rewrites that need no fixture file ----------------------------------------------------------


def test_suppressed_line_is_left_alone():
    source = (
        "import torch\n"
        "loss = torch.nn.functional.mse_loss(torch.zeros(2), torch.ones(2))\n"
        "print(loss.data[0])  # accelmigrate: skip[AM220]\n"
        "print(loss.data[0])\n"
    )
    result = migrate_source(source, MODERNIZE)
    assert result.code.splitlines()[2:] == ["print(loss.data[0])  # accelmigrate: skip[AM220]", "print(loss.item())"]


def test_reduction_none_keeps_indexing():
    source = (
        "import torch.nn.functional as F\n"
        "losses = F.mse_loss(a, b, reduction='none')\n"
        "kept = F.mse_loss(a, b, reduce=False)\n"
        "print(losses.data[0], kept.data[0])\n"
    )
    result = migrate_source(source, MODERNIZE)
    assert result.code.splitlines()[3] == "print(losses.data[0], kept.data[0])"
    assert result.code.splitlines()[2] == 'kept = F.mse_loss(a, b, reduction="none")'


def test_unreadable_legacy_flag_is_reported():
    source = "import torch.nn as nn\ncriterion = nn.MSELoss(size_average=args.average)\n"
    result = migrate_source(source, MODERNIZE)
    assert result.code == source
    assert [(f.code, f.fixed) for f in result.findings] == [("AM224", False)]


def test_variable_with_other_arguments_is_reported():
    source = "from torch.autograd import Variable\nx = Variable(t, False, True)\n"
    result = migrate_source(source, MODERNIZE)
    assert result.code == source
    assert [(f.code, f.fixed) for f in result.findings] == [("AM221", False)]


def test_variable_of_an_expression_keeps_its_precedence():
    source = (
        "import torch\nfrom torch.autograd import Variable\n"
        "a = torch.ones(2)\nb = torch.ones(2)\n"
        "y = Variable(a + b).sum()\n"
        "z = Variable(a * 2, requires_grad=True)\n"
    )
    result = migrate_source(source, MODERNIZE)
    assert result.code.splitlines()[-2:] == ["y = (a + b).sum()", "z = (a * 2).requires_grad_()"]


def test_indexing_a_plain_name_is_not_a_failure():
    """`sizes[0]` on a name that adds up nothing reaches the running-total check
    (every file with `name[0]` does): it must answer, not fail the codemod."""
    source = (
        "import torch\n\n"
        "sizes = [3, 4]\n"
        "first = sizes[0]\n"
        "total = 0\n"
        "for x in torch.randn(2, 3):\n"
        "    loss = (x * 2).sum()\n"
        "    loss.backward()\n"
        "    total += loss.data\n"
        "print(first, total[0])\n"
    )
    result = migrate_source(source, [("modernize", {})])
    assert not [f for f in result.findings if f.code == "AM000"], result.findings
    assert "total += loss.item()" in result.code and "print(first, total)" in result.code


def test_the_parts_of_modernize_do_not_import_the_codemod():
    """The parts share codemods/_modernize/planning.py, so that the codemod
    and its parts never import each other (not even for type checking)."""
    import ast

    from conftest import ROOT

    for part in sorted((ROOT / "codemods" / "_modernize").glob("*.py")):
        tree = ast.parse(part.read_text(encoding="utf-8"))
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 2]
        assert "modernize" not in imported, part.name
