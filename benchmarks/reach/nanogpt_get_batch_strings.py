"""nanoGPT-style loop: a string device, `device_type` derived from it, get_batch(split)
over one long token tensor (pinned when on CUDA), estimate_loss() under no_grad every
few iterations, a learning rate set by hand each iteration."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 12
block_size = 8
max_iters = 40
eval_interval = 10
eval_iters = 5
learning_rate = 2e-3
device = 'cuda' if torch.cuda.is_available() else 'cpu'
device_type = 'cuda' if 'cuda' in device else 'cpu'
print(f"using {device}")

torch.manual_seed(1337)
vocab_size = 27
tokens = torch.randint(0, vocab_size, (3000,), dtype=torch.long)
split_at = int(0.9 * len(tokens))
train_tokens, val_tokens = tokens[:split_at], tokens[split_at:]


def get_batch(split):
    data = train_tokens if split == 'train' else val_tokens
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    if device_type == 'cuda':
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


class TinyLM(nn.Module):
    def __init__(self, vocab, width):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(block_size, width))
        self.mix = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.out = nn.Linear(width, vocab)

    def forward(self, idx, targets=None):
        h = self.embed(idx) + self.pos[: idx.size(1)]
        h = h + self.mix(h)
        logits = self.out(h)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ['train', 'val']:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    return learning_rate * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * it / max_iters)))


model = TinyLM(vocab_size, 24)
model = model.to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95))

for iter_num in range(max_iters):
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    X, Y = get_batch('train')
    logits, loss = model(X, Y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()

print(f"final loss: {loss.item():.8f}")
