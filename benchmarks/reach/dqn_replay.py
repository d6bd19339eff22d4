"""DQN with a replay memory, a policy and a target network, epsilon-greedy actions,
smooth L1 on the Bellman target, periodic target sync; synthetic chain environment."""
import math
import random
from collections import deque, namedtuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

random.seed(0)
torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
Transition = namedtuple("Transition", ("state", "action", "next_state", "reward"))
BATCH_SIZE, GAMMA, EPS_START, EPS_END, EPS_DECAY, TARGET_UPDATE = 16, 0.9, 0.9, 0.05, 50, 5


class ReplayMemory(object):
    def __init__(self, capacity):
        self.memory = deque([], maxlen=capacity)

    def push(self, *args):
        self.memory.append(Transition(*args))

    def sample(self, batch_size):
        return random.sample(self.memory, batch_size)

    def __len__(self):
        return len(self.memory)


class DQN(nn.Module):
    def __init__(self, n_obs, n_actions):
        super(DQN, self).__init__()
        self.layer1 = nn.Linear(n_obs, 32)
        self.layer2 = nn.Linear(32, n_actions)

    def forward(self, x):
        return self.layer2(F.relu(self.layer1(x)))


policy_net = DQN(4, 2).to(device)
target_net = DQN(4, 2).to(device)
target_net.load_state_dict(policy_net.state_dict())
optimizer = optim.RMSprop(policy_net.parameters(), lr=1e-3)
memory = ReplayMemory(500)
steps_done = 0


def select_action(state):
    global steps_done
    eps = EPS_END + (EPS_START - EPS_END) * math.exp(-1.0 * steps_done / EPS_DECAY)
    steps_done += 1
    if random.random() > eps:
        with torch.no_grad():
            return policy_net(state).max(1)[1].view(1, 1)
    return torch.tensor([[random.randrange(2)]], device=device, dtype=torch.long)


def optimize_model():
    if len(memory) < BATCH_SIZE:
        return None
    batch = Transition(*zip(*memory.sample(BATCH_SIZE)))
    state_batch = torch.cat(batch.state)
    action_batch = torch.cat(batch.action)
    reward_batch = torch.cat(batch.reward)
    next_states = torch.cat(batch.next_state)
    state_action_values = policy_net(state_batch).gather(1, action_batch)
    next_values = target_net(next_states).max(1)[0].detach()
    expected = (next_values * GAMMA) + reward_batch
    loss = F.smooth_l1_loss(state_action_values, expected.unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    for param in policy_net.parameters():
        param.grad.data.clamp_(-1, 1)
    optimizer.step()
    return loss.item()


last_loss = None
for i_episode in range(12):
    state = torch.randn(1, 4, device=device)
    for t in range(8):
        action = select_action(state)
        next_state = state + 0.1 * (action.float() - 0.5)
        reward = torch.tensor([float(next_state.sum() > 0)], device=device)
        memory.push(state, action, next_state, reward)
        state = next_state
        value = optimize_model()
        if value is not None:
            last_loss = value
    if i_episode % TARGET_UPDATE == 0:
        target_net.load_state_dict(policy_net.state_dict())

print(f"final loss: {last_loss:.8f}")
