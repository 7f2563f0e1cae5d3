"""A Lightning-style module (`training_step`, `configure_optimizers`) driven by a minimal
trainer loop, as a user who wrote one without the library would: a small CNN on 32x32 images.
expect: device-bound
"""

import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
torch.set_num_threads(1)


class LitCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def fit(module, batches, max_steps):
    opt = module.configure_optimizers()
    for i in range(max_steps):
        loss = module.training_step(batches[i % len(batches)], i)
        opt.zero_grad()
        loss.backward()
        opt.step()


data = [(torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))) for _ in range(4)]
fit(LitCNN(), data, max_steps=10_000)
