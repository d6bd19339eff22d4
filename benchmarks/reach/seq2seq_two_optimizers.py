"""Seq2seq in the 2017 tutorial shape: an encoder and a decoder GRU, each with its own
optimizer, teacher forcing, a train() per pair and trainIters() looping over pairs."""
import random

import torch
import torch.nn as nn
from torch import optim

random.seed(0)
torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SOS_token, EOS_token, MAX_LENGTH, VOCAB, HIDDEN = 0, 1, 6, 12, 16
teacher_forcing_ratio = 0.5


class EncoderRNN(nn.Module):
    def __init__(self, input_size, hidden_size):
        super(EncoderRNN, self).__init__()
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size)

    def forward(self, input, hidden):
        output = self.embedding(input).view(1, 1, -1)
        return self.gru(output, hidden)

    def initHidden(self):
        return torch.zeros(1, 1, self.hidden_size, device=device)


class DecoderRNN(nn.Module):
    def __init__(self, hidden_size, output_size):
        super(DecoderRNN, self).__init__()
        self.embedding = nn.Embedding(output_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, output_size)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, input, hidden):
        output = torch.relu(self.embedding(input).view(1, 1, -1))
        output, hidden = self.gru(output, hidden)
        return self.softmax(self.out(output[0])), hidden


def train(input_tensor, target_tensor, encoder, decoder, encoder_optimizer, decoder_optimizer, criterion):
    encoder_hidden = encoder.initHidden()
    encoder_optimizer.zero_grad()
    decoder_optimizer.zero_grad()
    loss = 0
    for ei in range(input_tensor.size(0)):
        _, encoder_hidden = encoder(input_tensor[ei], encoder_hidden)
    decoder_input = torch.tensor([[SOS_token]], device=device)
    decoder_hidden = encoder_hidden
    use_teacher_forcing = random.random() < teacher_forcing_ratio
    for di in range(target_tensor.size(0)):
        decoder_output, decoder_hidden = decoder(decoder_input, decoder_hidden)
        loss += criterion(decoder_output, target_tensor[di])
        if use_teacher_forcing:
            decoder_input = target_tensor[di]
        else:
            decoder_input = decoder_output.topk(1)[1].squeeze().detach()
    loss.backward()
    encoder_optimizer.step()
    decoder_optimizer.step()
    return loss.item() / target_tensor.size(0)


def random_pair():
    length = random.randint(2, MAX_LENGTH - 1)
    seq = [random.randint(2, VOCAB - 1) for _ in range(length)] + [EOS_token]
    t = torch.tensor(seq, dtype=torch.long, device=device).view(-1, 1)
    return t, t.flip(0)


def trainIters(encoder, decoder, n_iters, learning_rate=0.05):
    encoder_optimizer = optim.SGD(encoder.parameters(), lr=learning_rate)
    decoder_optimizer = optim.SGD(decoder.parameters(), lr=learning_rate)
    criterion = nn.NLLLoss()
    plot_losses = []
    for it in range(1, n_iters + 1):
        input_tensor, target_tensor = random_pair()
        plot_losses.append(train(input_tensor, target_tensor, encoder, decoder, encoder_optimizer, decoder_optimizer, criterion))
    return plot_losses


encoder1 = EncoderRNN(VOCAB, HIDDEN).to(device)
decoder1 = DecoderRNN(HIDDEN, VOCAB).to(device)
losses = trainIters(encoder1, decoder1, 40)
print(f"final loss: {losses[-1]:.8f}")
