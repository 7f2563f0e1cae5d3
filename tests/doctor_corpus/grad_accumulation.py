"""Gradient accumulation: four micro-batches of 4 per optimizer step, a tiny-op model.
expect: overhead-bound
"""

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(*[m for _ in range(30) for m in (nn.Linear(16, 16), nn.ReLU())])
net.append(nn.Linear(16, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
ACCUMULATE = 4
for step in range(10_000):
    opt.zero_grad()
    for micro in range(ACCUMULATE):
        X, y = torch.randn(4, 16), torch.randint(0, 10, (4,))
        loss = F.cross_entropy(net(X), y) / ACCUMULATE
        loss.backward()
    opt.step()
