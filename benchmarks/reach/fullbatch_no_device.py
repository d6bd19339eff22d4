"""Full-batch regression that never names a device: no DataLoader, LBFGS-free plain Adam,
a closure-free loop over epochs, a learning-rate decay by hand."""
import torch
import torch.nn as nn

torch.manual_seed(0)
X = torch.linspace(-2, 2, 200).unsqueeze(1)
Y = torch.sin(3 * X) + 0.1 * torch.randn_like(X)

net = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
loss_func = nn.MSELoss()

for t in range(60):
    prediction = net(X)
    loss = loss_func(prediction, Y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if t % 20 == 19:
        for g in optimizer.param_groups:
            g["lr"] *= 0.5
        print(t, loss.item())

print(f"final loss: {loss.item():.8f}")
