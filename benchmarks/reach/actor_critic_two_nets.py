"""Actor-critic with separate actor and critic networks and optimizers, on a tiny
synthetic environment (a random walk toward a goal): returns, advantages, one update per episode."""
import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical

torch.manual_seed(0)
np.random.seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Walk:
    def reset(self):
        self.pos = 0.0
        self.t = 0
        return np.array([self.pos, 0.0], dtype=np.float32)

    def step(self, action):
        self.pos += 0.5 if action == 1 else -0.5
        self.t += 1
        done = abs(self.pos) >= 2.0 or self.t >= 10
        reward = 1.0 if self.pos >= 2.0 else -0.1
        return np.array([self.pos, self.t / 10], dtype=np.float32), reward, done


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2), nn.Softmax(dim=-1))

    def forward(self, s):
        return self.net(s)


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, s):
        return self.net(s)


env = Walk()
actor, critic = Actor().to(device), Critic().to(device)
adam_actor = torch.optim.Adam(actor.parameters(), lr=1e-3)
adam_critic = torch.optim.Adam(critic.parameters(), lr=1e-3)
gamma = 0.99
episode_rewards = []

for episode in range(20):
    state = env.reset()
    log_probs, values, rewards = [], [], []
    done = False
    while not done:
        s = torch.from_numpy(state).to(device)
        dist = Categorical(probs=actor(s))
        action = dist.sample()
        state, reward, done = env.step(action.item())
        log_probs.append(dist.log_prob(action))
        values.append(critic(s).squeeze())
        rewards.append(reward)
    returns, R = [], 0.0
    for r in reversed(rewards):
        R = r + gamma * R
        returns.insert(0, R)
    returns = torch.tensor(returns, device=device)
    values = torch.stack(values)
    advantage = returns - values
    critic_loss = advantage.pow(2).mean()
    adam_critic.zero_grad()
    critic_loss.backward()
    adam_critic.step()
    actor_loss = -(torch.stack(log_probs) * advantage.detach()).mean()
    adam_actor.zero_grad()
    actor_loss.backward()
    adam_actor.step()
    episode_rewards.append(sum(rewards))

print("mean reward", np.mean(episode_rewards))
print(f"final loss: {critic_loss.item() + actor_loss.item():.8f}")
