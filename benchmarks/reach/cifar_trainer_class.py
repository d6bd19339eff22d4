"""CIFAR-style trainer class (2020 style): self.device, a ResNet-like block with BatchNorm,
OneCycle scheduler, accuracy from argmax, best checkpoint saved by state_dict."""
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class BasicBlock(nn.Module):
    def __init__(self, planes):
        super().__init__()
        self.conv1 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(out)))


class TinyResNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.layer = BasicBlock(8)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        x = self.layer(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Trainer:
    def __init__(self, model, train_loader, val_loader, epochs, out_dir):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device)
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.epochs = epochs
        self.out_dir = out_dir
        self.criterion = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer, max_lr=0.1, epochs=epochs, steps_per_epoch=len(train_loader))
        self.best_acc = 0.0

    def train_epoch(self):
        self.model.train()
        for inputs, targets in self.train_loader:
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            self.optimizer.zero_grad()
            loss = self.criterion(self.model(inputs), targets)
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
        return loss.item()

    def validate(self):
        self.model.eval()
        correct = total = 0
        with torch.no_grad():
            for inputs, targets in self.val_loader:
                inputs, targets = inputs.to(self.device), targets.to(self.device)
                predicted = self.model(inputs).argmax(1)
                total += targets.size(0)
                correct += predicted.eq(targets).sum().item()
        return 100.0 * correct / total

    def fit(self):
        for epoch in range(self.epochs):
            last = self.train_epoch()
            acc = self.validate()
            if acc > self.best_acc:
                self.best_acc = acc
                torch.save(self.model.state_dict(), os.path.join(self.out_dir, "best.pth"))
            print(f"epoch {epoch} loss {last:.4f} acc {acc:.1f}")
        return last


def main():
    torch.manual_seed(0)
    images, labels = torch.randn(96, 3, 8, 8), torch.randint(0, 10, (96,))
    train_loader = DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=True, num_workers=0)
    val_loader = DataLoader(TensorDataset(images[:32], labels[:32]), batch_size=32)
    with tempfile.TemporaryDirectory() as out_dir:
        last = Trainer(TinyResNet(), train_loader, val_loader, 2, out_dir).fit()
    print(f"final loss: {last:.8f}")


if __name__ == "__main__":
    main()
