"""A small GAN on 2-D points: generator and discriminator with an optimizer each, noise
drawn on the device every step, the fake batch detached for the discriminator's update."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(999)
device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
nz, batch = 4, 32

angles = torch.rand(512) * 6.2832
points = torch.stack([angles.cos(), angles.sin()], dim=1) + 0.05 * torch.randn(512, 2)
dataloader = DataLoader(TensorDataset(points), batch_size=batch, shuffle=True, drop_last=True)

netG = nn.Sequential(nn.Linear(nz, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
netD = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1), nn.Sigmoid()).to(device)
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
real_label, fake_label = 1.0, 0.0

for epoch in range(3):
    for i, (real,) in enumerate(dataloader):
        real = real.to(device)
        netD.zero_grad()
        label = torch.full((batch,), real_label, device=device)
        errD_real = criterion(netD(real).view(-1), label)
        errD_real.backward()
        noise = torch.randn(batch, nz, device=device)
        fake = netG(noise)
        label.fill_(fake_label)
        errD_fake = criterion(netD(fake.detach()).view(-1), label)
        errD_fake.backward()
        errD = errD_real + errD_fake
        optimizerD.step()

        netG.zero_grad()
        label.fill_(real_label)
        errG = criterion(netD(fake).view(-1), label)
        errG.backward()
        optimizerG.step()
    print("[%d] Loss_D: %.4f Loss_G: %.4f" % (epoch, errD.item(), errG.item()))

print("final loss: %.8f" % (errD.item() + errG.item()))
