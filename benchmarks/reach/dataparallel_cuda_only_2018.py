"""CUDA-only 2018 multi-GPU code: `model = torch.nn.DataParallel(model).cuda()` in one
expression, the criterion moved too, loss.item() averaged in an AverageMeter."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class AverageMeter(object):
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, value, n=1):
        self.sum += value * n
        self.count += n

    @property
    def avg(self):
        return self.sum / max(self.count, 1)


torch.manual_seed(7)
model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
model = torch.nn.DataParallel(model).cuda()
criterion = nn.CrossEntropyLoss().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

data = torch.randn(128, 16)
target = data[:, :4].argmax(dim=1)
train_loader = DataLoader(TensorDataset(data, target), batch_size=32, shuffle=True)

for epoch in range(3):
    losses = AverageMeter()
    model.train()
    for input, label in train_loader:
        input, label = input.cuda(), label.cuda()
        output = model(input)
        loss = criterion(output, label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.update(loss.item(), input.size(0))
    print('Epoch {} Loss {:.4f}'.format(epoch, losses.avg))

print('final loss: %.8f' % loss.item())
