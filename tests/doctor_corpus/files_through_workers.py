"""Images read from files one at a time, decoded and resized per sample, with no workers.
expect: input-bound
"""

import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)
folder = Path(tempfile.mkdtemp(prefix="corpus-images-"))
rng = np.random.default_rng(0)
for i in range(64):
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(folder / f"{i}.png")


class Folder(Dataset):
    def __init__(self, root):
        self.files = sorted(Path(root).glob("*.png"))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        img = Image.open(self.files[i]).convert("RGB").resize((224, 224), Image.BICUBIC)
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255).permute(2, 0, 1)
        return x, i % 10


loader = DataLoader(Folder(folder), batch_size=8, shuffle=True)
net = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for epoch in range(1000):
    for X, y in loader:
        loss = F.cross_entropy(net(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
