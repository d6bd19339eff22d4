"""CUDA-only 2019 script: torch.cuda.set_device, cudnn.benchmark, .cuda(non_blocking=True),
a checkpoint saved with the optimizer state. Fails at once on a machine without CUDA."""
import argparse

import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--gpu", type=int, default=0)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

torch.cuda.set_device(args.gpu)
cudnn.benchmark = True
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).cuda(args.gpu)
criterion = nn.MSELoss().cuda(args.gpu)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
train_x, train_y = torch.randn(64, 8), torch.randn(64, 1)

for epoch in range(args.epochs):
    for i in range(0, 64, 16):
        inputs = train_x[i:i + 16].cuda(args.gpu, non_blocking=True)
        target = train_y[i:i + 16].cuda(args.gpu, non_blocking=True)
        loss = criterion(model(inputs), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("epoch", epoch, loss.item())

print(f"final loss: {loss.item():.8f}")
