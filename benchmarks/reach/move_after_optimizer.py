"""The optimizer is built before the model is moved (`model.to(device)` comes later, as
in many repositories where setup code was reordered); a validation split is scored
under no_grad every epoch."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset, random_split


def build_model(width):
    return nn.Sequential(nn.Linear(5, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))


torch.manual_seed(21)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

x = torch.randn(240, 5)
y = x @ torch.tensor([[0.5], [-1.0], [2.0], [0.0], [0.3]]) + 0.1 * torch.randn(240, 1)
train_set, val_set = random_split(TensorDataset(x, y), [200, 40], generator=torch.Generator().manual_seed(0))
train_loader = DataLoader(train_set, batch_size=25, shuffle=True)
val_loader = DataLoader(val_set, batch_size=40)

model = build_model(16)
optimizer = torch.optim.RMSprop(model.parameters(), lr=5e-3)
model.to(device)
mse = nn.MSELoss()


def validate():
    model.eval()
    total = 0.0
    with torch.no_grad():
        for xb, yb in val_loader:
            xb, yb = xb.to(device), yb.to(device)
            total += mse(model(xb), yb).item() * len(xb)
    model.train()
    return total / len(val_loader.dataset)


for epoch in range(4):
    for xb, yb in train_loader:
        xb, yb = xb.to(device), yb.to(device)
        optimizer.zero_grad()
        loss = mse(model(xb), yb)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} train {loss.item():.4f} val {validate():.4f}")

print(f"final loss: {loss.item():.8f}")
