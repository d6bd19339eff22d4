"""CycleGAN-style: two generators trained by one optimizer over itertools.chain of their
parameters, two discriminators each with its own optimizer, cycle and identity losses,
LambdaLR schedulers, an image pool skipped for brevity."""
import itertools

import torch
import torch.nn as nn

torch.manual_seed(0)
cuda = torch.cuda.is_available()
FEAT = 6


def generator():
    return nn.Sequential(nn.Linear(FEAT, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, FEAT))


def discriminator():
    return nn.Sequential(nn.Linear(FEAT, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))


G_AB, G_BA = generator(), generator()
D_A, D_B = discriminator(), discriminator()
criterion_GAN, criterion_cycle, criterion_identity = nn.MSELoss(), nn.L1Loss(), nn.L1Loss()
if cuda:
    G_AB, G_BA, D_A, D_B = G_AB.cuda(), G_BA.cuda(), D_A.cuda(), D_B.cuda()

optimizer_G = torch.optim.Adam(itertools.chain(G_AB.parameters(), G_BA.parameters()), lr=2e-4, betas=(0.5, 0.999))
optimizer_D_A = torch.optim.Adam(D_A.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizer_D_B = torch.optim.Adam(D_B.parameters(), lr=2e-4, betas=(0.5, 0.999))
n_epochs, decay_epoch = 3, 1
lr_lambda = lambda epoch: 1.0 - max(0, epoch - decay_epoch) / (n_epochs - decay_epoch)
lr_scheduler_G = torch.optim.lr_scheduler.LambdaLR(optimizer_G, lr_lambda=lr_lambda)
Tensor = torch.cuda.FloatTensor if cuda else torch.Tensor
domain_A = torch.randn(64, FEAT)
domain_B = torch.randn(64, FEAT) + 1.5

for epoch in range(n_epochs):
    for i in range(0, 64, 16):
        real_A = domain_A[i:i + 16].type(Tensor)
        real_B = domain_B[i:i + 16].type(Tensor)
        valid = Tensor(real_A.size(0), 1).fill_(1.0)
        fake = Tensor(real_A.size(0), 1).fill_(0.0)

        optimizer_G.zero_grad()
        loss_id = (criterion_identity(G_BA(real_A), real_A) + criterion_identity(G_AB(real_B), real_B)) / 2
        fake_B = G_AB(real_A)
        fake_A = G_BA(real_B)
        loss_GAN = (criterion_GAN(D_B(fake_B), valid) + criterion_GAN(D_A(fake_A), valid)) / 2
        loss_cycle = (criterion_cycle(G_BA(fake_B), real_A) + criterion_cycle(G_AB(fake_A), real_B)) / 2
        loss_G = loss_GAN + 10.0 * loss_cycle + 5.0 * loss_id
        loss_G.backward()
        optimizer_G.step()

        optimizer_D_A.zero_grad()
        loss_D_A = (criterion_GAN(D_A(real_A), valid) + criterion_GAN(D_A(fake_A.detach()), fake)) / 2
        loss_D_A.backward()
        optimizer_D_A.step()

        optimizer_D_B.zero_grad()
        loss_D_B = (criterion_GAN(D_B(real_B), valid) + criterion_GAN(D_B(fake_B.detach()), fake)) / 2
        loss_D_B.backward()
        optimizer_D_B.step()
    lr_scheduler_G.step()
    print(f"[Epoch {epoch}] [D loss: {(loss_D_A + loss_D_B).item():.4f}] [G loss: {loss_G.item():.4f}]")

print(f"final loss: {loss_G.item():.8f}")
