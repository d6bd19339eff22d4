"""The work of `amp` and `ddp` grows linearly with a flat script.

A tutorial-style script written at module level, repeated N times, binds the
same names in every copy: a codemod that, for each training loop, looks at
every call of the file does N times the work per loop, N squared in all. The
measure here is the number of steps up the tree (parent look-ups in the
script model's index), counted for 10 and for 40 copies: linear work makes about 4
times as many, quadratic work about 16 times.
"""

import pytest

from accelmigrate.codemods.script.scopes import Index
from accelmigrate.engine.migrate import migrate_source

HEADER = '''"""Several short training runs, one after another."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
'''

RUN = """
# run {i}: a small regression
samples = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
batches = DataLoader(samples, batch_size=16, shuffle=True)
net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
for epoch in range(3):
    for inputs, targets in batches:
        inputs, targets = inputs.to(device), targets.to(device)
        opt.zero_grad()
        error = nn.functional.mse_loss(net(inputs), targets)
        error.backward()
        opt.step()
    print("run {i}", epoch, error.item())
"""


def flat_script(copies: int) -> str:
    return HEADER + "".join(RUN.format(i=i) for i in range(copies))


def steps_up_the_tree(monkeypatch, word: str, copies: int) -> int:
    """Parent look-ups made while `word` checks `copies` copies of the run."""
    counted = [0]
    ancestors, parent = Index.ancestors, Index.parent

    def counting_ancestors(self, node):
        for ancestor in ancestors(self, node):
            counted[0] += 1
            yield ancestor

    def counting_parent(self, node):
        counted[0] += 1
        return parent(self, node)

    monkeypatch.setattr(Index, "ancestors", counting_ancestors)
    monkeypatch.setattr(Index, "parent", counting_parent)
    migration = migrate_source(
        flat_script(copies), [(word, {})], "runs.py", check_only=True
    )
    monkeypatch.undo()
    assert any(
        f.word == word for f in migration.findings
    ), migration.findings  # the codemod did its work
    return counted[0]


@pytest.mark.parametrize("word", ["amp", "ddp"])
def test_work_grows_linearly_with_a_flat_script(monkeypatch, word):
    few = steps_up_the_tree(monkeypatch, word, 10)
    many = steps_up_the_tree(monkeypatch, word, 40)
    assert few > 0
    assert many / few < 6, (few, many)  # 4 when linear, 16 when quadratic
