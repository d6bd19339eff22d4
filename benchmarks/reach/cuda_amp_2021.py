"""2021 native mixed precision: torch.cuda.amp.GradScaler and autocast, gradient clipping
after unscale_, enabled only when CUDA is there (so it also runs on a CPU)."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def train_one_epoch(model, loader, optimizer, scaler, device, use_amp):
    model.train()
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.amp.autocast(enabled=use_amp):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    return loss.item()


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    use_amp = device.type == "cuda"
    loader = DataLoader(TensorDataset(torch.randn(128, 12), torch.randint(0, 5, (128,))), batch_size=32, shuffle=True, pin_memory=True)
    model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 5)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = torch.cuda.amp.GradScaler(enabled=use_amp)
    for epoch in range(3):
        last = train_one_epoch(model, loader, optimizer, scaler, device, use_amp)
        print(f"epoch {epoch} loss {last:.4f}")
    print(f"final loss: {last:.8f}")


if __name__ == "__main__":
    main()
