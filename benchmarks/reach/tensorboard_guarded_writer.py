"""A 2020 training script that logs to TensorBoard when it is installed: the import is
guarded, the writer may be None, and scalars are written once per epoch."""
import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

try:
    from torch.utils.tensorboard import SummaryWriter
except ImportError:
    SummaryWriter = None

torch.manual_seed(3)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

features = torch.randn(192, 6)
targets = (features[:, :2].sum(dim=1, keepdim=True) > 0).float()
loader = DataLoader(TensorDataset(features, targets), batch_size=24, shuffle=True)

net = nn.Sequential(nn.Linear(6, 20), nn.Tanh(), nn.Linear(20, 1)).to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
loss_fn = nn.BCEWithLogitsLoss()

log_dir = os.path.join(tempfile.gettempdir(), "reach_tb_runs")
writer = SummaryWriter(log_dir) if SummaryWriter is not None else None

step = 0
for epoch in range(4):
    running = 0.0
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        opt.zero_grad()
        loss = loss_fn(net(xb), yb)
        loss.backward()
        opt.step()
        running += loss.item()
        step += 1
        if writer is not None:
            writer.add_scalar("train/batch_loss", loss.item(), step)
    if writer is not None:
        writer.add_scalar("train/epoch_loss", running / len(loader), epoch)
    print(f"epoch {epoch}: mean loss {running / len(loader):.4f}")

if writer is not None:
    writer.close()
print(f"final loss: {loss.item():.8f}")
