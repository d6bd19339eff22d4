"""Multi-GPU habit of 2019 on a script that also runs on a laptop: the model is wrapped
and moved in one chained expression when CUDA is there, and the optimizer is made after."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class SmallConv(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, kernel_size=3, padding=1)
        self.head = nn.Linear(6 * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.head(x.view(x.size(0), -1))


torch.manual_seed(11)
use_cuda = torch.cuda.is_available()
device = torch.device("cuda" if use_cuda else "cpu")

model = SmallConv()
if use_cuda:
    model = nn.DataParallel(model).cuda()

images = torch.randn(96, 3, 8, 8)
labels = torch.randint(0, 4, (96,))
train_loader = DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=True)
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
criterion = nn.CrossEntropyLoss()

for epoch in range(3):
    model.train()
    correct = 0
    for inputs, classes in train_loader:
        inputs, classes = inputs.to(device), classes.to(device)
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = criterion(outputs, classes)
        loss.backward()
        optimizer.step()
        correct += (outputs.argmax(1) == classes).sum().item()
    print("epoch %d acc %.3f" % (epoch, correct / len(train_loader.dataset)))

print("final loss: %.8f" % loss.item())
