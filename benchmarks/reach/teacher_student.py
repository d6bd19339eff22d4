"""Knowledge distillation: a frozen teacher in eval mode, a student trained on a mix of
the soft teacher targets (KL at a temperature) and the hard labels."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_mlp(width):
    return nn.Sequential(nn.Linear(10, width), nn.ReLU(), nn.Linear(width, 4))


def distillation_loss(student_logits, teacher_logits, labels, T=3.0, alpha=0.7):
    soft = F.kl_div(F.log_softmax(student_logits / T, dim=1), F.softmax(teacher_logits / T, dim=1), reduction="batchmean")
    return alpha * soft * T * T + (1 - alpha) * F.cross_entropy(student_logits, labels)


def train_student(teacher, student, loader, optimizer, device, epochs):
    teacher.eval()
    for epoch in range(epochs):
        student.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with torch.no_grad():
                teacher_logits = teacher(x)
            loss = distillation_loss(student(x), teacher_logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: {loss.item():.4f}")
    return loss.item()


if __name__ == "__main__":
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, y = torch.randn(128, 10), torch.randint(0, 4, (128,))
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    teacher = make_mlp(64).to(device)
    student = make_mlp(8).to(device)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    last = train_student(teacher, student, loader, optimizer, device, epochs=3)
    print(f"final loss: {last:.8f}")
