"""Code from the 0.3 -> 0.4 transition: Variable wrappers and volatile=True for
evaluation, next to the new .item(); CUDA used when there, through use_cuda flags."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable

torch.manual_seed(6)
use_cuda = torch.cuda.is_available()


class MLP(nn.Module):
    def __init__(self):
        super(MLP, self).__init__()
        self.l1 = nn.Linear(10, 30)
        self.l2 = nn.Linear(30, 4)

    def forward(self, x):
        return F.log_softmax(self.l2(F.relu(self.l1(x))), dim=1)


model = MLP()
if use_cuda:
    model.cuda()
optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)

train_x, train_y = torch.randn(128, 10), torch.randint(0, 4, (128,))
val_x, val_y = torch.randn(48, 10), torch.randint(0, 4, (48,))


def evaluate(x, y):
    model.eval()
    inputs = Variable(x, volatile=True)
    targets = Variable(y, volatile=True)
    if use_cuda:
        inputs, targets = inputs.cuda(), targets.cuda()
    output = model(inputs)
    loss = F.nll_loss(output, targets)
    pred = output.data.max(1)[1]
    correct = pred.eq(targets.data).sum().item()
    return loss.item(), correct


for epoch in range(4):
    model.train()
    for i in range(0, 128, 32):
        inputs, targets = Variable(train_x[i:i + 32]), Variable(train_y[i:i + 32])
        if use_cuda:
            inputs, targets = inputs.cuda(), targets.cuda()
        optimizer.zero_grad()
        loss = F.nll_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
    val_loss, correct = evaluate(val_x, val_y)
    print("epoch {}: train {:.4f} val {:.4f} ({}/48)".format(epoch, loss.item(), val_loss, correct))

print("final loss: %.8f" % loss.item())
