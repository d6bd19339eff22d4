"""Advantage actor-critic over a vector of environments in the gymnasium style:
envs.reset() and envs.step(actions) return batched arrays, rollouts of a few steps are
collected, then one update on the returns. The environments are a small class here."""
import torch
import torch.nn as nn
from torch.distributions import Categorical


class LineWorldVec:
    """num_envs copies of a walk on a line: reach +5 for a reward, -5 ends the episode."""

    def __init__(self, num_envs, seed):
        self.num_envs = num_envs
        self.rng = torch.Generator().manual_seed(seed)
        self.position = torch.zeros(num_envs)
        self.t = torch.zeros(num_envs)

    def _obs(self):
        return torch.stack([self.position / 5.0, self.t / 20.0], dim=1)

    def reset(self):
        self.position = torch.randint(-2, 3, (self.num_envs,), generator=self.rng).float()
        self.t.zero_()
        return self._obs(), {}

    def step(self, actions):
        slip = torch.rand(self.num_envs, generator=self.rng) < 0.1
        move = torch.where(slip, -1.0, actions.float() * 2.0 - 1.0)
        self.position += move
        self.t += 1
        terminated = self.position.abs() >= 5
        truncated = self.t >= 20
        rewards = torch.where(self.position >= 5, 1.0, -0.01)
        done = terminated | truncated
        if done.any():
            self.position[done] = torch.randint(-2, 3, (int(done.sum()),), generator=self.rng).float()
            self.t[done] = 0
        return self._obs(), rewards, terminated, truncated, {}


class ActorCritic(nn.Module):
    def __init__(self, obs_dim=2, actions=2, hidden=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, actions)
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


torch.manual_seed(4)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
envs = LineWorldVec(num_envs=8, seed=4)
agent = ActorCritic().to(device)
optimizer = torch.optim.Adam(agent.parameters(), lr=3e-3)
gamma, rollout_len = 0.95, 10

obs, _ = envs.reset()
for update in range(40):
    log_probs, values, rewards, masks, entropies = [], [], [], [], []
    for _ in range(rollout_len):
        logits, value = agent(obs.to(device))
        dist = Categorical(logits=logits)
        actions = dist.sample()
        obs, reward, terminated, truncated, _ = envs.step(actions.cpu())
        log_probs.append(dist.log_prob(actions))
        entropies.append(dist.entropy())
        values.append(value)
        rewards.append(reward.to(device))
        masks.append((~(terminated | truncated)).float().to(device))
    with torch.no_grad():
        _, next_value = agent(obs.to(device))
    returns, running = [], next_value
    for r, m in zip(reversed(rewards), reversed(masks)):
        running = r + gamma * running * m
        returns.insert(0, running)
    returns = torch.stack(returns)
    values = torch.stack(values)
    advantage = returns - values
    actor_loss = -(torch.stack(log_probs) * advantage.detach()).mean()
    critic_loss = advantage.pow(2).mean()
    loss = actor_loss + 0.5 * critic_loss - 0.01 * torch.stack(entropies).mean()
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
    optimizer.step()
    if update % 10 == 0:
        print(f"update {update} loss {loss.item():.4f} mean reward {torch.stack(rewards).mean().item():.4f}")

print(f"final loss: {loss.item():.8f}")
