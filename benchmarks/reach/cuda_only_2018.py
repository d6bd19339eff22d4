"""2018 style: .cuda() everywhere, Variable, loss.data[0]; runs only on a CUDA machine."""
import torch
import torch.nn as nn
from torch.autograd import Variable

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3)).cuda()
criterion = nn.CrossEntropyLoss().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

x_all = torch.randn(120, 12)
y_all = torch.randint(0, 3, (120,))

for epoch in range(4):
    total = 0
    for start in range(0, 120, 20):
        inputs = Variable(x_all[start:start + 20].cuda())
        labels = Variable(y_all[start:start + 20].cuda())
        optimizer.zero_grad()
        loss = criterion(model(inputs), labels)
        loss.backward()
        optimizer.step()
        total += loss.data[0]
    print("epoch", epoch, "loss", total / 6)

print("final loss: %.8f" % loss.data[0])
