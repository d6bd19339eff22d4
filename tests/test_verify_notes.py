"""`verify` names the note that explains an expected difference (issue 29,
item 8): a last batch the ranks share out unevenly (the bundled
char_lstm.py: 89 sequences in batches of 16), BatchNorm statistics of a
split batch, and random draws a function of the file makes for the step
(a gradient penalty's interpolation weights). Each word that splits a
batch notes these where it migrates, and `verify` shows the same from
what the runs recorded: each step's samples per rank, BatchNorm in
training, dropout."""

from __future__ import annotations

import pytest

from accelmigrate.engine.migrate import migrate_source
from conftest import SCRIPTS, exact
from test_verify_trust import project_with, run_verify

BATCH_NORM_NET = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.body(x)


def main():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=generator)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16, drop_last=True)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    print("weights %.6f" % model.body[0].weight.sum().item())


if __name__ == "__main__":
    main()
'''

PENALISED_CRITIC = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def interpolation_penalty(critic, real, fake):
    weight = torch.rand(real.size(0), 1)
    between = (weight * real + (1 - weight) * fake).requires_grad_(True)
    (grad,) = torch.autograd.grad(critic(between).sum(), between, create_graph=True)
    return ((grad.norm(2, dim=1) - 1) ** 2).mean()


def main():
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=16, drop_last=True)
    critic = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(critic.parameters(), lr=0.01)
    for epoch in range(2):
        for (real,) in loader:
            fake = real.flip(1)
            loss = critic(fake).mean() - critic(real).mean() + 10 * interpolation_penalty(critic, real, fake)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    print("weights %.6f" % critic[0].weight.sum().item())


if __name__ == "__main__":
    main()
'''


def notes_of(source: str, word: str, options: dict = None) -> list[str]:
    return [f.code for f in migrate_source(source, [(word, options or {})], "train.py").findings]


@pytest.mark.parametrize("word, note", [("ddp", "AM536"), ("accelerate", "AM811"), ("fabric", "AM911")])
def test_a_loader_without_drop_last_is_noted_by_each_word_that_splits_its_batches(word, note):
    source = (SCRIPTS / "char_lstm.py").read_text()
    assert note in notes_of(source, word)
    kept = source.replace("shuffle=False, num_workers=0)", "shuffle=False, num_workers=0, drop_last=True)")
    assert kept != source and note not in notes_of(kept, word)


def test_accumulating_over_a_batch_norm_model_is_noted():
    assert "AM614" in notes_of(BATCH_NORM_NET, "accumulate", {"value": "2"})
    layer_norm = BATCH_NORM_NET.replace("nn.BatchNorm1d(16)", "nn.LayerNorm(16)")
    assert "AM614" not in notes_of(layer_norm, "accumulate", {"value": "2"})


@pytest.mark.parametrize("word, note", [("ddp", "AM535"), ("accelerate", "AM816"), ("fabric", "AM916")])
def test_a_draw_in_a_function_the_step_calls_is_noted(word, note):
    assert note in notes_of(PENALISED_CRITIC, word)
    fixed = PENALISED_CRITIC.replace("weight = torch.rand(real.size(0), 1)", "weight = 0.5")
    assert note not in notes_of(fixed, word)


@pytest.mark.slow
@pytest.mark.parametrize("word, note", [("ddp", "AM536"), ("accelerate", "AM811"), ("fabric", "AM911")])
def test_verify_names_the_note_of_an_uneven_last_batch(tmp_path, word, note):
    project = project_with(tmp_path, "char_lstm.py")
    code, result = run_verify(str(project / "char_lstm.py"), "--to", exact(word), "--steps", "8", "--json")
    assert code == 1 and result["verdict"] == "differ", result
    assert result["first_differing_step"] == 6, result  # the epoch's sixth batch holds its last 9 sequences
    assert "step 6's batch of 9 samples ran as " in result["expected"], result["expected"]
    assert f"note {note} at char_lstm.py:" in result["expected"], result["expected"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "source, words, named",
    [
        (BATCH_NORM_NET, "accumulate=2", ["BatchNorm normalises each part of the batch split into micro-batches", "AM614"]),
        (BATCH_NORM_NET, "ddp", ["BatchNorm normalises each part of the batch split across processes", "AM538"]),
        (PENALISED_CRITIC, "ddp", ["random numbers drawn for the training step", "AM535"]),
    ],
    ids=["batch-norm-accumulated", "batch-norm-ranks", "helper-draw-ranks"],
)
def test_verify_names_the_note_of_statistics_and_draws_of_a_split_batch(tmp_path, source, words, named):
    script = tmp_path / "train.py"
    script.write_text(source)
    code, result = run_verify(str(script), "--to", words, "--steps", "3", "--json")
    assert code == 1 and result["verdict"] == "differ", result
    assert all(part in result["expected"] for part in named), result["expected"]
