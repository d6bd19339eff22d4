"""A trainer class of the 2021 kind: the optimizer and the scheduler come from factory
functions called in __init__, the device is a string compared in places, evaluation
runs under torch.no_grad() in a method of its own."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def make_optimizer(name, params, lr):
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True)


def make_scheduler(optimizer, epochs):
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)


class Trainer:
    def __init__(self, model, train_loader, val_loader, cfg):
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = model.to(self.device)
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.cfg = cfg
        self.criterion = nn.CrossEntropyLoss()
        self.optimizer = make_optimizer(cfg["optimizer"], self.model.parameters(), cfg["lr"])
        self.scheduler = make_scheduler(self.optimizer, cfg["epochs"])
        if self.device == "cuda":
            torch.backends.cudnn.benchmark = True
        print(f"trainer on {self.device}")

    def train_epoch(self):
        self.model.train()
        for inputs, labels in self.train_loader:
            inputs, labels = inputs.to(self.device), labels.to(self.device)
            self.optimizer.zero_grad()
            loss = self.criterion(self.model(inputs), labels)
            loss.backward()
            self.optimizer.step()
        self.scheduler.step()
        return loss.item()

    def evaluate(self):
        self.model.eval()
        hits, seen = 0, 0
        with torch.no_grad():
            for inputs, labels in self.val_loader:
                inputs, labels = inputs.to(self.device), labels.to(self.device)
                hits += (self.model(inputs).argmax(dim=1) == labels).sum().item()
                seen += labels.numel()
        return hits / seen

    def fit(self):
        last = None
        for epoch in range(self.cfg["epochs"]):
            last = self.train_epoch()
            print(f"epoch {epoch}: loss {last:.4f} acc {self.evaluate():.3f} lr {self.scheduler.get_last_lr()[0]:.5f}")
        return last


if __name__ == "__main__":
    torch.manual_seed(2)
    data = torch.randn(200, 12)
    labels = data[:, :3].argmax(dim=1)
    train_loader = DataLoader(TensorDataset(data[:160], labels[:160]), batch_size=20, shuffle=True)
    val_loader = DataLoader(TensorDataset(data[160:], labels[160:]), batch_size=40)
    net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
    trainer = Trainer(net, train_loader, val_loader, {"optimizer": "sgd", "lr": 0.05, "epochs": 4})
    final = trainer.fit()
    print(f"final loss: {final:.8f}")
