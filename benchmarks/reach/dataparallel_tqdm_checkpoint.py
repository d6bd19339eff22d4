"""DataParallel applied whatever the machine (it passes through on a CPU), a tqdm bar over
the loader with the loss as postfix, and the best checkpoint saved from model.module."""
import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 24), nn.SiLU(), nn.Linear(24, 1))

    def forward(self, x):
        return self.layers(x)


def main():
    torch.manual_seed(31)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(256, 8)
    y = torch.sin(x[:, :1]) + 0.5 * x[:, 1:2]
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)

    model = nn.DataParallel(Regressor()).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.01)
    criterion = nn.SmoothL1Loss()
    best = float("inf")
    checkpoint = os.path.join(tempfile.gettempdir(), "reach_dp_tqdm_best.pt")

    for epoch in range(3):
        bar = tqdm(loader, desc=f"epoch {epoch}", disable=None)
        total = 0.0
        for inputs, targets in bar:
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            loss.backward()
            optimizer.step()
            total += loss.item()
            bar.set_postfix(loss=f"{loss.item():.4f}")
        mean = total / len(loader)
        if mean < best:
            best = mean
            torch.save(model.module.state_dict(), checkpoint)
    print(f"final loss: {loss.item():.8f}")


if __name__ == "__main__":
    main()
