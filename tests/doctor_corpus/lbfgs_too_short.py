"""The same kind of L-BFGS fit, stopped after 5 steps: fewer than the doctor's windows need.
expect: inconclusive
"""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.LBFGS(net.parameters(), max_iter=20)
X, y = torch.randn(64, 4), torch.randn(64, 1)


def closure():
    opt.zero_grad()
    loss = nn.functional.mse_loss(net(X), y)
    loss.backward()
    return loss


for step in range(5):
    opt.step(closure)
