"""What the README guarantees, on code nobody wrote a fixture for: for any
source that CPython accepts, every codemod neither crashes (no exception, no
AM000 finding), its output parses, and a second run changes nothing.

Seeded and small enough for CI; `python benchmarks/fuzz.py` runs thousands of
the same cases, and `python benchmarks/torch_corpus.py` torch's own sources.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

import hypothesmith
from fuzzing import (
    MUTATION_NAMES, VALUES, all_words_plan, generated_programs, mutated_inputs, plans, problems_of, spliced_scripts, statements,
)

# Generated code may hold `0()` and the like: valid, and warned about when compiled.
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")

# Derandomized: the same examples on every run, so CI never fails by chance.
SEEDED = settings(
    derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=False
)


def assert_holds(source: str, plan) -> None:
    problems, _ = problems_of(source, plan, "<property>")
    assert not problems, "\n".join(map(str, problems)) + "\n--- source ---\n" + source


@settings(SEEDED, max_examples=150)
@given(source=generated_programs())
def test_generated_programs_through_every_codemod(source):
    assert_holds(source, all_words_plan())


@settings(SEEDED, max_examples=25)
@given(source=spliced_scripts(statements()), plan=plans())
def test_training_script_with_rebound_names(source, plan):
    assert_holds(source, plan)


@settings(SEEDED, max_examples=10)
@given(source=spliced_scripts(hypothesmith.from_grammar()), plan=plans())
def test_training_script_with_generated_statements(source, plan):
    assert_holds(source, plan)


# Each mutation on two inputs (bundled scripts and fixture inputs, a different
# pair per mutation); benchmarks/fuzz.py runs every input.
@pytest.mark.parametrize("mutation", MUTATION_NAMES)
def test_mutated_training_scripts(mutation):
    cases = list(mutated_inputs(mutation, 2))
    assert cases, f"{mutation} changed none of the inputs"
    failures = [f"{path.name}: {p}" for path, source in cases for p in problems_of(source, all_words_plan(), str(path))[0]]
    assert not failures, "\n".join(failures)


# Failures these properties found, each reduced to its smallest source.
REPRODUCTIONS = [
    pytest.param(
        # `device` read but bound nowhere in the file: the inserted binding must
        # take another name, or a second run would rewrite `.cuda(device)`.
        "import torch\n\nx = torch.zeros(1).cuda(device)\ny = torch.zeros(1).cuda()\n",
        "device",
        id="device-captures-a-free-name-device",
    ),
    pytest.param(
        # The training step's device is read off the model (`device =
        # next(model.parameters()).device`); an evaluation that only calls a
        # method of the model must find it on the first run, not the second.
        "import torch\nfrom torch import nn\n\nmodel_renamed = nn.DataParallel(nn.Linear(2, 2))\n"
        "optimizer_renamed = torch.optim.SGD(model_renamed.parameters(), lr=0.1)\n"
        "for x in loader:\n    loss = model_renamed(x).mean()\n    loss.backward()\n    optimizer_renamed.step()\n"
        "with torch.no_grad():\n    y = model_renamed.module.generate(x)\n",
        "main-guard,device,amp",
        id="evaluation-through-a-method-of-the-model",
    ),
    pytest.param(
        # One module called under two names (ddp refuses: AM520); compile's
        # `model = torch.compile(model)` must not hide that `model` is `net`,
        # or a second run wraps one name and leaves the other's forward bare.
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\nfrom data import train_set\n\n"
        "net = nn.Linear(4, 1)\nmodel = net\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(train_set, batch_size=16)\nfor epoch in range(3):\n    for xb, yb in loader:\n"
        "        optimizer.zero_grad()\n        loss = nn.functional.mse_loss(net(xb), yb) + nn.functional.mse_loss(model(xb), yb)\n"
        "        loss.backward()\n        optimizer.step()\n",
        "compile,ddp",
        id="compiled-alias-of-the-model",
    ),
    pytest.param(
        # The student's device cannot be read off it once ddp wraps it; the
        # teacher's evaluation binds `device` off the teacher, which a second
        # run finds in reach of the step: the first run must read it too.
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\nfrom data import images, load_teacher\n\n"
        "teacher = nn.DataParallel(load_teacher()).eval()\nstudent = nn.DataParallel(nn.Linear(784, 10))\n"
        "optimizer = torch.optim.SGD(student.parameters(), lr=0.1)\nloader = DataLoader(images, batch_size=256)\n"
        "for epoch in range(10):\n    for x, _ in loader:\n        with torch.no_grad():\n            soft = teacher(x).softmax(1)\n"
        "        loss = nn.functional.kl_div(student(x).log_softmax(1), soft, reduction=\"batchmean\")\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n",
        "ddp,amp",
        id="teacher-device-read-by-the-student-step",
    ),
    pytest.param(
        # A GPU index that holds a placement of its own: `device_at(<its text>)`
        # would copy the inner `.cuda()` unmigrated for a second run to rewrite.
        "import torch\n\nx = torch.zeros(1).to(torch.device('cuda', torch.zeros(1).cuda([])))\n",
        "device",
        id="gpu-index-holding-a-placement",
    ),
    pytest.param(
        # A GPU index that is a device itself (`torch.device('cuda', torch.device('cuda', i))`): the
        # inner one becomes `device_at(i)` on the first run, which the outer must not take as a plain index.
        "import torch\nimport torch.nn as nn\n\nmodel = nn.Linear(2, 2).cuda()\n\n\ndef pick(i):\n    return torch.device('cuda', torch.device('cuda', i))\n",
        "device",
        id="gpu-index-that-is-a-device",
    ),
    pytest.param(
        # A torch.device is no tensor in memory: given as a loader's dataset, the
        # loader gets workers on the first run as on the second (device_at(...)).
        "import torch\nfrom torch.utils.data import DataLoader\n\n"
        "for x in DataLoader(torch.device('cuda', rank), batch_size=4):\n    x.backward()\n",
        "workers,device",
        id="device-given-as-a-dataset",
    ),
    pytest.param(
        # `nn = nn.DataParallel(m)` in a function: the name is made by a call
        # through itself, which the search for an imported callee followed forever.
        "import torch\nimport torch.nn as nn\n\n\ndef train(loader):\n    model = nn.DataParallel(nn.Linear(2, 2))\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    for x in loader:\n        nn = nn.DataParallel(model)\n"
        "        loss = model(x).sum()\n        loss.backward()\n        optimizer.step()\n",
        "ddp",
        id="name-made-through-itself",
    ),
]


@pytest.mark.parametrize("source, words", REPRODUCTIONS)
def test_reduced_failure(source, words):
    assert_holds(source, [(w, dict(VALUES.get(w, {}))) for w in words.split(",")])
