"""A plain loop: a wide MLP on tensors already in memory. Nothing to fix in the loop.
expect: device-bound
"""

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
torch.set_num_threads(1)
X, y = torch.randn(64, 1024), torch.randint(0, 10, (64,))
net = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for step in range(10_000):
    loss = F.cross_entropy(net(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
