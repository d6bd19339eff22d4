"""Autoencoder whose evaluation leaves torch: outputs to numpy for a hand-written
R^2 metric and a histogram, the way plotting and metrics libraries are fed."""
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data = torch.randn(200, 16)


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
        self.decoder = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 16))

    def forward(self, x):
        return self.decoder(self.encoder(x))


def r2_score(y_true, y_pred):
    return 1 - ((y_true - y_pred) ** 2).sum() / ((y_true - y_true.mean()) ** 2).sum()


model = AutoEncoder().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
loss_fn = nn.MSELoss()
for epoch in range(5):
    for start in range(0, 200, 25):
        batch = data[start:start + 25].to(device)
        output = model(batch)
        loss = loss_fn(output, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    reconstruction = model(data.to(device)).data.cpu().numpy()
    codes = model.encoder(data.to(device)).detach().cpu().numpy()
    counts, _ = np.histogram(codes[:, 0], bins=5)
    print(f"epoch {epoch} r2 {r2_score(data.numpy(), reconstruction):.3f} hist {counts.tolist()}")

print(f"final loss: {loss.item():.8f}")
