"""Small GPT trained from a config dict (2023 style): get_batch from one long tensor,
AdamW with weight decay groups, cosine schedule by hand, estimate_loss under no_grad."""
import math

import torch
import torch.nn as nn
from torch.nn import functional as F

config = dict(block_size=16, vocab_size=40, n_embd=32, n_head=4, n_layer=2, batch_size=8,
              max_iters=30, eval_interval=10, learning_rate=3e-3, device="cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(1337)
data = torch.randint(0, config["vocab_size"], (2000,))
n = int(0.9 * len(data))
train_data, val_data = data[:n], data[n:]


def get_batch(split):
    source = train_data if split == "train" else val_data
    ix = torch.randint(len(source) - config["block_size"], (config["batch_size"],))
    x = torch.stack([source[i:i + config["block_size"]] for i in ix])
    y = torch.stack([source[i + 1:i + config["block_size"] + 1] for i in ix])
    return x.to(config["device"]), y.to(config["device"])


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        T = x.size(1)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok = nn.Embedding(cfg["vocab_size"], cfg["n_embd"])
        self.pos = nn.Embedding(cfg["block_size"], cfg["n_embd"])
        self.blocks = nn.Sequential(*[Block(cfg["n_embd"], cfg["n_head"]) for _ in range(cfg["n_layer"])])
        self.ln_f = nn.LayerNorm(cfg["n_embd"])
        self.head = nn.Linear(cfg["n_embd"], cfg["vocab_size"])

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.blocks(self.tok(idx) + self.pos(pos))
        logits = self.head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


@torch.no_grad()
def estimate_loss(model):
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(4)
        for k in range(4):
            X, Y = get_batch(split)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    return config["learning_rate"] * 0.5 * (1 + math.cos(math.pi * it / config["max_iters"]))


def main():
    model = GPT(config).to(config["device"])
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=config["learning_rate"])
    for it in range(config["max_iters"]):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it)
        if it % config["eval_interval"] == 0:
            losses = estimate_loss(model)
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        xb, yb = get_batch("train")
        _, loss = model(xb, yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print(f"final loss: {loss.item():.8f}")


if __name__ == "__main__":
    main()
