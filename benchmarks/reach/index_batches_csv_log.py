"""Mini-batches drawn by index from tensors held in memory (no DataLoader), with a
csv.writer log of each epoch; a common shape in research code on small tabular data."""
import csv
import os
import tempfile

import torch
import torch.nn as nn

torch.manual_seed(5)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

n, batch_size = 300, 32
X = torch.randn(n, 7)
Y = (X[:, 0] * X[:, 1] > 0).long()
X, Y = X.to(device), Y.to(device)

clf = nn.Sequential(nn.Linear(7, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
optim = torch.optim.Adam(clf.parameters(), lr=1e-2)
ce = nn.CrossEntropyLoss()

log_path = os.path.join(tempfile.gettempdir(), "reach_index_batches.csv")
with open(log_path, "w", newline="") as handle:
    log = csv.writer(handle)
    log.writerow(["epoch", "loss"])
    for epoch in range(5):
        for _ in range(n // batch_size):
            idx = torch.randperm(n)[:batch_size]
            xb, yb = X[idx], Y[idx]
            optim.zero_grad()
            loss = ce(clf(xb), yb)
            loss.backward()
            optim.step()
        log.writerow([epoch, f"{loss.item():.6f}"])
        print(f"epoch {epoch} loss {loss.item():.4f}")

print(f"final loss: {loss.item():.8f}")
