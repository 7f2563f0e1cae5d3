"""A loop that logs its loss with `.item()` every step (and sums an accuracy the same way).
expect: sync-bound
"""

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
torch.set_num_threads(1)
X, y = torch.randn(64, 1024), torch.randint(0, 10, (64,))
net = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
opt = torch.optim.SGD(net.parameters(), lr=1e-3)
history = []
for step in range(10_000):
    out = net(X)
    loss = F.cross_entropy(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    history.append(loss.item())
    correct = (out.argmax(1) == y).sum().item()
