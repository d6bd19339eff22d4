"""CUDA-only 2018 code: the optimizer is built first, model.cuda() is called after it,
batches are sent with .cuda(non_blocking=True) and cudnn.benchmark is switched on."""
import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.cuda.manual_seed(0)

model = nn.Sequential(nn.Conv1d(2, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16, 5))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
criterion = nn.CrossEntropyLoss().cuda()
model.cuda()
cudnn.benchmark = True

signals = torch.randn(120, 2, 16)
classes = torch.randint(0, 5, (120,))
train_loader = DataLoader(TensorDataset(signals, classes), batch_size=24, shuffle=True, pin_memory=True)

for epoch in range(3):
    model.train()
    for i, (input, target) in enumerate(train_loader):
        input = input.cuda(non_blocking=True)
        target = target.cuda(non_blocking=True)
        output = model(input)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print('Epoch: [{0}]\tLoss {1:.4f}'.format(epoch, loss.item()))

print('final loss: %.8f' % loss.item())
