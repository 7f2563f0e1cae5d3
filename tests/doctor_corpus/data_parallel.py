"""The model wrapped in torch.nn.DataParallel, as older tutorials do: one process drives every
device, scattering the batch and copying the model each step. DistributedDataParallel instead
(on a CPU DataParallel only calls the module, so the loop itself is a plain one).
expect: any
finds: data-parallel
"""

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
torch.set_num_threads(1)
net = nn.DataParallel(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
X, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
for step in range(10_000):
    loss = F.cross_entropy(net(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
