"""Apex-era script: the apex import behind try/except ImportError that re-raises with an
install hint, amp.initialize at O1, scaled backward. Cannot start without apex."""
import torch
import torch.nn as nn

try:
    from apex import amp
except ImportError:
    raise ImportError("Please install apex from https://www.github.com/nvidia/apex to run this example.")

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 2)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
criterion = nn.CrossEntropyLoss()
x, y = torch.randn(64, 6), torch.randint(0, 2, (64,))

for step in range(10):
    inputs, labels = x.to(device), y.to(device)
    loss = criterion(model(inputs), labels)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()

print(f"final loss: {loss.item():.8f}")
