"""Early stopping on a validation loss with a patience counter, the best weights kept with
copy.deepcopy and restored at the end; tqdm-free progress printing."""
import copy

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset, random_split


def run_epoch(model, loader, criterion, optimizer=None):
    training = optimizer is not None
    model.train(training)
    total = 0.0
    with torch.set_grad_enabled(training):
        for xb, yb in loader:
            loss = criterion(model(xb), yb)
            if training:
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            total += loss.item() * xb.size(0)
    return total / len(loader.dataset)


def main():
    torch.manual_seed(0)
    x = torch.randn(240, 5)
    y = x @ torch.randn(5, 1) + 0.05 * torch.randn(240, 1)
    train_set, val_set = random_split(TensorDataset(x, y), [200, 40], generator=torch.Generator().manual_seed(0))
    train_loader = DataLoader(train_set, batch_size=20, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=40)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    criterion = nn.MSELoss()
    best_loss, best_state, patience, bad_epochs = float("inf"), None, 2, 0
    for epoch in range(30):
        train_loss = run_epoch(model, train_loader, criterion, optimizer)
        val_loss = run_epoch(model, val_loader, criterion)
        print(f"epoch {epoch} train {train_loss:.4f} val {val_loss:.4f}")
        if val_loss < best_loss - 1e-4:
            best_loss, best_state, bad_epochs = val_loss, copy.deepcopy(model.state_dict()), 0
        else:
            bad_epochs += 1
            if bad_epochs >= patience:
                print("early stop")
                break
    model.load_state_dict(best_state)
    print(f"final loss: {best_loss:.8f}")


if __name__ == "__main__":
    main()
