"""Flat tutorial shape: module-level data, model, loop; device chosen inline; no main guard."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

inputs = torch.randn(256, 20)
targets = (inputs[:, :5].sum(dim=1) > 0).long()
train_loader = DataLoader(TensorDataset(inputs, targets), batch_size=32, shuffle=True)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


model = Net().to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

for epoch in range(3):
    running = 0.0
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = criterion(model(data), target)
        loss.backward()
        optimizer.step()
        running += loss.item()
    print("epoch %d loss %.4f" % (epoch, running / len(train_loader)))

print(f"final loss: {loss.item():.8f}")
