"""A GAN: a discriminator step and a generator step per iteration, two optimizers; the loop
prints both losses with `.item()` every iteration. Its tiny layers put it at the overhead
threshold on a 2-core CPU: overhead-bound, or else its reads come first (counted, not costed on
a CPU: its own two, and Adam's inside torch.optim, which the report attributes to torch.optim).
expect: overhead-bound|sync-bound
"""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()
for it in range(10_000):
    real = torch.randn(64, 2) * 0.5 + 1.0
    fake = G(torch.randn(64, 8))
    loss_d = bce(D(real), torch.ones(64, 1)) + bce(D(fake.detach()), torch.zeros(64, 1))
    opt_d.zero_grad()
    loss_d.backward()
    opt_d.step()
    loss_g = bce(D(fake), torch.ones(64, 1))
    opt_g.zero_grad()
    loss_g.backward()
    opt_g.step()
    if it % 1 == 0:
        print(f"{it} d={loss_d.item():.3f} g={loss_g.item():.3f}")
