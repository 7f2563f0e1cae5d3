"""Batches made on the host in pageable memory and copied to the GPU each step with a plain
.to("cuda"): each copy is staged by the driver and the host waits for it, so the GPU idles
while the batch crosses. pin_memory and non_blocking=True (or the data kept on the device).
needs: cuda
expect: copy-bound
"""

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4096, 256), nn.ReLU(), nn.Linear(256, 10)).to("cuda")
opt = torch.optim.SGD(net.parameters(), lr=0.01)
X, y = torch.randn(2048, 4096), torch.randint(0, 10, (2048,))  # 32 MiB a batch, pageable
for step in range(10_000):
    Xd, yd = X.to("cuda"), y.to("cuda")  # the fix: pinned X, .to("cuda", non_blocking=True)
    loss = F.cross_entropy(net(Xd), yd)
    opt.zero_grad()
    loss.backward()
    opt.step()
