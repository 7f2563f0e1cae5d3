"""Narrow layers (32 wide) on a large batch: each matmul is too thin to reach the machine's
rate and LayerNorm and GELU move bytes without arithmetic, so the device (here the CPU's core)
is busy far below its ceiling. Not "nothing to fix": wider layers, fusion, autocast raise it.
expect: device-bound, below its ceiling
unseen: copies between host and device
"""

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
torch.set_num_threads(1)
width = 32
blocks = [m for _ in range(4) for m in (nn.Linear(width, width), nn.LayerNorm(width), nn.GELU())]
net = nn.Sequential(nn.Linear(64, width), *blocks, nn.Linear(width, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
X, y = torch.randn(4096, 64), torch.randint(0, 10, (4096,))
for step in range(10_000):
    loss = F.cross_entropy(net(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
