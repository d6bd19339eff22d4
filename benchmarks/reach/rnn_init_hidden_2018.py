"""2018 tutorial-style character RNN classifier: the network's own initHidden() is
called at the start of every step, and the sequence is fed one time step at a time."""
import torch
import torch.nn as nn

torch.manual_seed(8)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

n_letters, n_hidden, n_categories = 10, 24, 3


class RNN(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super(RNN, self).__init__()
        self.hidden_size = hidden_size
        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.i2o = nn.Linear(input_size + hidden_size, output_size)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, input, hidden):
        combined = torch.cat((input, hidden), 1)
        hidden = torch.tanh(self.i2h(combined))
        output = self.softmax(self.i2o(combined))
        return output, hidden

    def initHidden(self):
        return torch.zeros(1, self.hidden_size, device=device)


def random_example():
    length = int(torch.randint(3, 7, (1,)))
    letters = torch.randint(0, n_letters, (length,))
    line_tensor = torch.zeros(length, 1, n_letters)
    line_tensor[torch.arange(length), 0, letters] = 1.0
    category = torch.tensor([int(letters.sum()) % n_categories])
    return category, line_tensor


rnn = RNN(n_letters, n_hidden, n_categories).to(device)
criterion = nn.NLLLoss()
optimizer = torch.optim.SGD(rnn.parameters(), lr=0.05)


def train(category_tensor, line_tensor):
    hidden = rnn.initHidden()
    optimizer.zero_grad()
    for i in range(line_tensor.size()[0]):
        output, hidden = rnn(line_tensor[i], hidden)
    loss = criterion(output, category_tensor)
    loss.backward()
    optimizer.step()
    return output, loss.item()


current_loss = 0.0
for iteration in range(1, 301):
    category_tensor, line_tensor = random_example()
    output, loss = train(category_tensor.to(device), line_tensor.to(device))
    current_loss += loss
    if iteration % 100 == 0:
        print("%d %.4f" % (iteration, current_loss / 100))
        current_loss = 0.0

print("final loss: %.8f" % loss)
