"""2017 PyTorch 0.3 habits: Variable(..., volatile=True) for evaluation, loss.data[0],
size_average=False, nn.init.xavier_uniform without the underscore."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable

torch.manual_seed(0)
use_cuda = torch.cuda.is_available()


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)
        nn.init.xavier_uniform(self.fc1.weight)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


model = Net()
if use_cuda:
    model = model.cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
train_x, train_y = torch.randn(96, 8), torch.randint(0, 3, (96,))
test_x, test_y = torch.randn(32, 8), torch.randint(0, 3, (32,))


def train(epoch):
    model.train()
    for i in range(0, 96, 16):
        data, target = train_x[i:i + 16], train_y[i:i + 16]
        if use_cuda:
            data, target = data.cuda(), target.cuda()
        data, target = Variable(data), Variable(target)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
    print("Train Epoch: {} Loss: {:.6f}".format(epoch, loss.data[0]))
    return loss.data[0]


def test():
    model.eval()
    data, target = Variable(test_x, volatile=True), Variable(test_y)
    if use_cuda:
        data, target = data.cuda(), target.cuda()
    output = model(data)
    test_loss = F.nll_loss(output, target, size_average=False).data[0] / 32
    print("Test set: Average loss: {:.4f}".format(test_loss))


for epoch in range(1, 4):
    last = train(epoch)
    test()
print("final loss: %.8f" % last)
