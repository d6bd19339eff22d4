"""Two losses over one shared trunk, back-propagated one after the other: the first
backward keeps the graph (retain_graph=True) so that the second can run through it."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class TwoHeaded(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(9, 32), nn.ReLU())
        self.regress = nn.Linear(32, 1)
        self.classify = nn.Linear(32, 2)

    def forward(self, x):
        h = self.trunk(x)
        return self.regress(h), self.classify(h)


torch.manual_seed(17)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

x = torch.randn(160, 9)
y_value = x[:, :1] * 2.0 - x[:, 1:2]
y_class = (x[:, 2] > 0).long()
loader = DataLoader(TensorDataset(x, y_value, y_class), batch_size=20, shuffle=True)

model = TwoHeaded().to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=4e-3)
mse, ce = nn.MSELoss(), nn.CrossEntropyLoss()

for epoch in range(4):
    for xb, vb, cb in loader:
        xb, vb, cb = xb.to(device), vb.to(device), cb.to(device)
        optimizer.zero_grad()
        value, logits = model(xb)
        value_loss = mse(value, vb)
        class_loss = ce(logits, cb)
        value_loss.backward(retain_graph=True)
        class_loss.backward()
        optimizer.step()
        loss = value_loss + class_loss
    print(f"epoch {epoch}: value {value_loss.item():.4f} class {class_loss.item():.4f}")

print(f"final loss: {loss.item():.8f}")
