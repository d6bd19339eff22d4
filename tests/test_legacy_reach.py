"""modernize on pre-0.4 scripts in the shapes of 2017-2018 code
(fixtures/modernize/reach_*.py): each original crashes on today's torch;
the migrated script runs and prints what the same script written for
today's torch by hand prints, including whether its evaluation values carry
a graph (False: the volatile code now runs under no_grad)."""

import re

import pytest

from accelmigrate.engine.migrate import migrate_source

from conftest import FIXTURES, run_python

CASES = FIXTURES / "modernize"
NUMBER = re.compile(r"-?\d+\.\d+")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}

# Each case as its author would have written it for PyTorch 0.4+.
BY_HAND = {
    "reach_eval_function": '''
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

torch.manual_seed(3)
features, labels = torch.randn(64, 6), torch.randint(0, 3, (64,))
dataset = torch.utils.data.TensorDataset(features, labels)
train_loader = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True)
test_loader = torch.utils.data.DataLoader(dataset, batch_size=32)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(6, 12)
        self.out = nn.Linear(12, 3)

    def forward(self, x):
        return self.out(F.relu(self.hidden(x)))


model = Classifier()
criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train(epoch):
    model.train()
    total_loss = 0.0
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = criterion(model(data), target)
        loss.backward()
        optimizer.step()
        total_loss += loss.item()
        if batch_idx % 2 == 0:
            print(f'epoch {epoch} batch {batch_idx} loss {loss.item():.6f}')
    return total_loss / len(train_loader)


@torch.no_grad()
def test():
    model.eval()
    test_loss, correct = 0.0, 0
    for data, target in test_loader:
        output = model(data)
        test_loss += criterion(output, target).item()
        correct += (output.argmax(1) == target).sum().item()
    test_loss /= len(test_loader)
    print(f'test loss {test_loss:.6f} correct {correct} graph {output.requires_grad}')
    return test_loss


for epoch in range(1, 3):
    mean = train(epoch)
    print(f'epoch {epoch} mean loss {mean:.6f}')
    test()
''',
    "reach_flat_shared_names": '''
import torch
import torch.nn as nn

torch.manual_seed(5)
net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
inputs, classes = torch.randn(48, 5), torch.randint(0, 2, (48,))
train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs[:32], classes[:32]), batch_size=8)
val_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs[32:], classes[32:]), batch_size=8)

previous = None
for epoch in range(3):
    if previous is not None:
        print('last training loss of the epoch before: %.6f' % previous)
    net.train()
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = criterion(net(x), y)
        loss.backward()
        optimizer.step()
    print('epoch %d train loss %.6f' % (epoch, loss.item()))
    net.eval()
    val_loss = 0.0
    with torch.no_grad():
        for x, y in val_loader:
            val_batch = criterion(net(x), y)
            val_loss += val_batch.item()
    previous = val_batch.item()
    print('epoch %d val loss %.6f last batch %.6f graph %s'
          % (epoch, val_loss / len(val_loader), val_batch.item(), val_batch.requires_grad))

with torch.no_grad():
    scores = net(inputs[32:])
    test_loss = criterion(scores, classes[32:])
print('test loss %.6f graph %s' % (test_loss.item(), scores.requires_grad))
''',
    "reach_dqn_target": '''
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(7)
policy_net = nn.Linear(4, 2)
target_net = nn.Linear(4, 2)
target_net.load_state_dict(policy_net.state_dict())
optimizer = torch.optim.RMSprop(policy_net.parameters(), lr=0.01)
GAMMA = 0.9


def optimize_model(states, actions, rewards, next_states):
    state_action_values = policy_net(states).gather(1, actions)
    with torch.no_grad():
        next_state_values = target_net(next_states).max(1).values
    expected = next_state_values * GAMMA + rewards
    loss = F.smooth_l1_loss(state_action_values, expected.unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    for param in policy_net.parameters():
        param.grad.clamp_(-1, 1)
    optimizer.step()
    return loss.item()


for step in range(4):
    batch = torch.randn(6, 4), torch.randint(0, 2, (6, 1)), torch.randn(6), torch.randn(6, 4)
    print('step %d loss %.6f' % (step, optimize_model(*batch)))
print('weight %.6f' % policy_net.weight.sum().item())
''',
    "reach_returned_losses": '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Trainer:
    def __init__(self, model):
        self.model = model
        self.criterion = nn.SmoothL1Loss()
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def train_step(self, x, y):
        self.optimizer.zero_grad()
        out = self.model(x)
        loss = self.criterion(out, y) + 0.5 * F.mse_loss(out, y)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def fit(self, batches):
        total_loss = 0.0
        for i, (x, y) in enumerate(batches):
            loss = self.train_step(x, y)
            total_loss += loss
            print('step %d loss %.6f' % (i, loss))
        return total_loss


torch.manual_seed(11)
model = nn.Linear(3, 2)
trainer = Trainer(model)
data = [(torch.randn(4, 3), torch.randn(4, 2)) for _ in range(3)]
print('total %.6f' % trainer.fit(data))

head_a, head_b = nn.Linear(2, 1), nn.Linear(2, 1)
features = model(torch.randn(5, 3))
first = head_a(features).pow(2).mean()
first.backward(retain_graph=True)
print('first head %.6f' % first.item())
second = head_b(features).abs().sum()
second.backward()
print('second head %.6f' % second.item())
print('grad %.6f' % model.weight.grad.sum().item())
print('first weight %.6f' % model.weight[0].sum().item())
''',
}
CRASHES = ("0-dim tensor", "retain_variables")


MODERNIZE = ("modernize",)
DEFAULT_WORDS = ("modernize", "workers", "item", "empty-cache")  # what `accelmigrate apply` runs


def migrated(case: str, tmp_path, words=MODERNIZE):
    source = (CASES / f"{case}.py").read_text(encoding="utf-8")
    result = migrate_source(source, [(word, {}) for word in words], f"{case}.py")
    target = tmp_path / f"{case}.py"
    target.write_text(result.code, encoding="utf-8")
    return target, result


def numbers_and_words(text: str):
    return [NUMBER.sub("#", line) for line in text.splitlines()], [float(n) for n in NUMBER.findall(text)]


@pytest.mark.parametrize("words", [MODERNIZE, DEFAULT_WORDS], ids=["modernize", "defaults"])
@pytest.mark.parametrize("case", sorted(BY_HAND))
def test_migrated_script_prints_what_the_hand_modernised_one_prints(case, words, tmp_path):
    before = run_python(CASES / f"{case}.py", env=ONE_THREAD)
    assert before.returncode != 0 and any(crash in before.stderr for crash in CRASHES), before.stderr

    script, result = migrated(case, tmp_path, words)
    left = [f.message for f in result.findings if not f.fixed and f.code.startswith("AM22")]
    assert not left, left
    after = run_python(script, env=ONE_THREAD)
    assert after.returncode == 0, after.stderr
    assert "Warning" not in after.stderr  # volatile, Variable and retain_variables all gone

    reference = tmp_path / "by_hand.py"
    reference.write_text(BY_HAND[case], encoding="utf-8")
    expected = run_python(reference, env=ONE_THREAD)
    assert expected.returncode == 0, expected.stderr
    got_lines, got = numbers_and_words(after.stdout)
    want_lines, want = numbers_and_words(expected.stdout)
    assert got_lines == want_lines and len(got) >= 4
    assert got == pytest.approx(want, abs=1e-6)


def test_refused_regions_keep_the_backward_calls_after_them_working(tmp_path):
    """Under no_grad, `penalty` would have no graph and `spread.backward()`
    would raise: the refused regions leave both as they run today."""
    script, result = migrated("reach_refusals", tmp_path)
    assert [f.code for f in result.findings if not f.fixed] == ["AM222", "AM222"]
    after = run_python(script, env=ONE_THREAD)
    assert after.returncode == 0, after.stderr
    assert "spread" in after.stdout


def test_a_file_whose_only_old_idiom_is_retain_variables_is_migrated():
    from accelmigrate.codemods.script import precheck, words_that_may_apply

    source = "import torch\nw = torch.ones(2, requires_grad=True)\n(w * 2).sum().backward(retain_variables=True)\n"
    assert words_that_may_apply(precheck(source), ["modernize"]) == ["modernize"]
    result = migrate_source(source, [("modernize", {})], "retain.py")
    assert result.code.endswith(".backward(retain_graph=True)\n")
    assert [(f.code, f.fixed) for f in result.findings] == [("AM226", True)]
