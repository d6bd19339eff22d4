"""A string device chosen from the command line or CUDA's presence, compared to 'cuda'
to pick pin_memory and the loader's workers, and printed; a test pass scored each epoch."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()
device = args.device
print(f"using {device}")

torch.manual_seed(12)
x = torch.randn(180, 4)
y = (x.norm(dim=1) > 2).long()
loader_args = dict(batch_size=30, shuffle=True)
if device == "cuda":
    loader_args.update(pin_memory=True)
train_loader = DataLoader(TensorDataset(x[:150], y[:150]), **loader_args)
test_loader = DataLoader(TensorDataset(x[150:], y[150:]), batch_size=30)

model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.CrossEntropyLoss()

for epoch in range(args.epochs):
    model.train()
    for xb, yb in train_loader:
        xb, yb = xb.to(device), yb.to(device)
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        right = sum((model(xb.to(device)).argmax(1) == yb.to(device)).sum().item() for xb, yb in test_loader)
    print(f"epoch {epoch} loss {loss.item():.4f} test acc {right / 30:.3f}")

print(f"final loss: {loss.item():.8f}")
