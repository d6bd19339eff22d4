"""Character LSTM language model, flat: text to indices, random chunks, hidden state
carried and detached between chunks, clip_grad_norm_."""
import random
import time

import torch
import torch.nn as nn

random.seed(0)
torch.manual_seed(0)
text = "the quick brown fox jumps over the lazy dog. " * 20
chars = sorted(set(text))
char_to_ix = {c: i for i, c in enumerate(chars)}
data = torch.tensor([char_to_ix[c] for c in text], dtype=torch.long)
n_chars = len(chars)
chunk_len, hidden_size, n_layers = 24, 32, 2
use_cuda = torch.cuda.is_available()


class CharRNN(nn.Module):
    def __init__(self, vocab, hidden, layers):
        super().__init__()
        self.encoder = nn.Embedding(vocab, hidden)
        self.rnn = nn.LSTM(hidden, hidden, layers, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(out), hidden

    def init_hidden(self, batch):
        weight = next(self.parameters())
        return (weight.new_zeros(n_layers, batch, hidden_size), weight.new_zeros(n_layers, batch, hidden_size))


def random_batch(batch=8):
    starts = [random.randint(0, len(data) - chunk_len - 2) for _ in range(batch)]
    inp = torch.stack([data[s:s + chunk_len] for s in starts])
    tgt = torch.stack([data[s + 1:s + chunk_len + 1] for s in starts])
    if use_cuda:
        inp, tgt = inp.cuda(), tgt.cuda()
    return inp, tgt


decoder = CharRNN(n_chars, hidden_size, n_layers)
if use_cuda:
    decoder.cuda()
decoder_optimizer = torch.optim.Adam(decoder.parameters(), lr=0.005)
criterion = nn.CrossEntropyLoss()

start = time.time()
all_losses = []
loss_avg = 0
hidden = decoder.init_hidden(8)
for step in range(1, 41):
    inp, target = random_batch()
    hidden = tuple(h.detach() for h in hidden)
    decoder.zero_grad()
    output, hidden = decoder(inp, hidden)
    loss = criterion(output.reshape(-1, n_chars), target.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(decoder.parameters(), 5.0)
    decoder_optimizer.step()
    loss_avg += loss.item()
    if step % 10 == 0:
        all_losses.append(loss_avg / 10)
        print("[%ds (%d %d%%) %.4f]" % (time.time() - start, step, step / 40 * 100, loss_avg / 10))
        loss_avg = 0

print(f"final loss: {loss.item():.8f}")
