"""A loop that keeps each step's features for a metric at the end of the epoch, without
`.detach()`: each step's autograd graph stays alive with them, and with it the batch the first
layer saved for its backward (256 KiB a step). Fast enough; it runs out of memory hours in.
expect: memory-growth
"""

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(nn.Linear(1024, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
bank = []  # features for a nearest-neighbour accuracy at the end of the epoch
for step in range(10_000):
    X, y = torch.randn(64, 1024), torch.randint(0, 10, (64,))
    bank.append(net[:2](X))  # the fix: net[:2](X).detach()
    loss = F.cross_entropy(net(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
