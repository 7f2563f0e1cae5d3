"""A small sequence model fitted with L-BFGS: each step(closure) runs several forward and
backward passes of many tiny ops, and L-BFGS reads values on the host inside its line search.
expect: overhead-bound
"""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
rnn = nn.GRU(4, 8, batch_first=True)
head = nn.Linear(8, 1)
params = [*rnn.parameters(), *head.parameters()]
opt = torch.optim.LBFGS(params, max_iter=4, history_size=5)
X, y = torch.randn(16, 12, 4), torch.randn(16, 1)


def closure():
    opt.zero_grad()
    out, _ = rnn(X)
    loss = nn.functional.mse_loss(head(out[:, -1]), y)
    loss.backward()
    return loss


for step in range(10_000):
    opt.step(closure)
