"""WGAN-GP in the GAN-collection shape: `Tensor = torch.cuda.FloatTensor if cuda else
torch.FloatTensor`, Variable, a gradient penalty through autograd.grad, n_critic steps."""
import argparse

import numpy as np
import torch
import torch.autograd as autograd
import torch.nn as nn
from torch.autograd import Variable

parser = argparse.ArgumentParser()
parser.add_argument("--n_epochs", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.0002)
parser.add_argument("--latent_dim", type=int, default=6)
parser.add_argument("--n_critic", type=int, default=2)
opt = parser.parse_args()

np.random.seed(0)
torch.manual_seed(0)
cuda = True if torch.cuda.is_available() else False
data_dim = 10
lambda_gp = 10


class Generator(nn.Module):
    def __init__(self):
        super(Generator, self).__init__()
        self.model = nn.Sequential(nn.Linear(opt.latent_dim, 32), nn.LeakyReLU(0.2, inplace=True), nn.Linear(32, data_dim))

    def forward(self, z):
        return self.model(z)


class Discriminator(nn.Module):
    def __init__(self):
        super(Discriminator, self).__init__()
        self.model = nn.Sequential(nn.Linear(data_dim, 32), nn.LeakyReLU(0.2, inplace=True), nn.Linear(32, 1))

    def forward(self, x):
        return self.model(x)


generator = Generator()
discriminator = Discriminator()
if cuda:
    generator.cuda()
    discriminator.cuda()

dataset = torch.randn(96, data_dim) * 0.3 + 2.0
dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batch_size, shuffle=True)
optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt.lr, betas=(0.5, 0.999))
optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt.lr, betas=(0.5, 0.999))
Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor


def compute_gradient_penalty(D, real_samples, fake_samples):
    alpha = Tensor(np.random.random((real_samples.size(0), 1)))
    interpolates = (alpha * real_samples + ((1 - alpha) * fake_samples)).requires_grad_(True)
    d_interpolates = D(interpolates)
    fake = Variable(Tensor(real_samples.shape[0], 1).fill_(1.0), requires_grad=False)
    gradients = autograd.grad(
        outputs=d_interpolates, inputs=interpolates, grad_outputs=fake, create_graph=True, retain_graph=True, only_inputs=True
    )[0]
    return ((gradients.norm(2, dim=1) - 1) ** 2).mean()


for epoch in range(opt.n_epochs):
    for i, samples in enumerate(dataloader):
        real_samples = Variable(samples.type(Tensor))
        optimizer_D.zero_grad()
        z = Variable(Tensor(np.random.normal(0, 1, (samples.shape[0], opt.latent_dim))))
        fake_samples = generator(z)
        gradient_penalty = compute_gradient_penalty(discriminator, real_samples.data, fake_samples.data)
        d_loss = -torch.mean(discriminator(real_samples)) + torch.mean(discriminator(fake_samples)) + lambda_gp * gradient_penalty
        d_loss.backward()
        optimizer_D.step()
        optimizer_G.zero_grad()
        if i % opt.n_critic == 0:
            fake_samples = generator(z)
            g_loss = -torch.mean(discriminator(fake_samples))
            g_loss.backward()
            optimizer_G.step()
    print("[Epoch %d/%d] [D loss: %f] [G loss: %f]" % (epoch, opt.n_epochs, d_loss.item(), g_loss.item()))

print(f"final loss: {d_loss.item():.8f}")
