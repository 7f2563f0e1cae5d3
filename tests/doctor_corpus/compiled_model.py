"""A torch.compile'd model: the doctor runs and times it; what happens inside the compiled
graph is not counted op by op, and the report says so.
expect: any
unseen: inside compiled graphs
"""

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
model = torch.compile(net)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
X, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
for step in range(10_000):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
