"""Two small training loops with known bottlenecks, for showing the profiler's diagnosis.

- `data_bound_loop`: images stored PNG-compressed, decoded and augmented per sample in Python
  (PIL), feeding a tiny model: most of the step time is spent waiting for the next batch.
- `compute_bound_loop`: the same images held in memory as one uint8 tensor, feeding the d2l
  ResNet-18: the model's arithmetic dominates.

The dataset lives here (not in a notebook cell) so DataLoader workers can import it under the
`spawn` start method too.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator

import numpy as np
import torch
from PIL import Image, ImageFilter
from torch import nn
from torch.utils.data import DataLoader, Dataset

from . import models, synthetic


class PNGImages(Dataset):
    """Images kept PNG-encoded in memory; every access decodes, upsizes, rotates, blurs, normalises."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, *, size: int = 64) -> None:
        if images.ndim != 3 or images.dtype != np.uint8:
            raise ValueError(f"images must be uint8 (N, H, W), got {images.dtype} {images.shape}")
        if len(images) != len(labels):
            raise ValueError("images and labels must have the same length")
        self.blobs = []
        for img in images:
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, format="PNG")
            self.blobs.append(buf.getvalue())
        self.labels = torch.as_tensor(labels, dtype=torch.long)
        self.size = size

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        img = Image.open(io.BytesIO(self.blobs[i])).convert("L")
        img = img.resize((self.size, self.size), Image.BICUBIC)
        img = img.rotate(float((i * 7) % 21 - 10), resample=Image.BICUBIC)
        img = img.filter(ImageFilter.GaussianBlur(2))
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0)[None]
        return (x - 0.5) / 0.5, self.labels[i]


def _images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = synthetic.class_images(n, 28, 28, 1, seed=seed)
    return x[..., 0], y


def _sgd_step(net: nn.Module, lr: float = 0.05) -> Callable[[tuple[torch.Tensor, torch.Tensor]], float]:
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        X, y = batch
        opt.zero_grad(set_to_none=True)
        loss_fn(net(X), y).backward()
        opt.step()

    return step


def data_bound_loop(n: int = 512, batch_size: int = 32, *, size: int = 128, seed: int = 0,
                    device: str | torch.device = "cpu") -> tuple[Callable, DataLoader]:
    """(step, loader): per-sample PNG decode + resize + rotate in the main process, tiny model."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    x, y = _images(n, seed)
    ds = PNGImages(x, y, size=size)
    net = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(16, 10)).to(device)

    def to_device(batch_iter: DataLoader) -> Iterator:
        for X, yb in batch_iter:
            yield X.to(device), yb.to(device)

    loader = DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=0)
    step = _sgd_step(net)
    return step, _Mapped(loader, to_device)


def compute_bound_loop(n: int = 512, batch_size: int = 32, *, width: int = 16, seed: int = 0,
                       device: str | torch.device = "cpu") -> tuple[Callable, _Mapped]:
    """(step, batches): in-memory uint8 tensor batches into the d2l ResNet-18."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    x, y = _images(n, seed)
    X = torch.from_numpy(x)[:, None].to(device)
    Y = torch.from_numpy(y).to(device)
    net = models.resnet18(width=width).to(device)

    def batches(_: object) -> Iterator:
        perm = torch.randperm(len(X), device=device)
        for i in range(0, len(X) - batch_size + 1, batch_size):
            idx = perm[i:i + batch_size]
            yield (X[idx].float() / 255 - 0.5) / 0.5, Y[idx]

    return _sgd_step(net), _Mapped(None, batches)


class _Mapped:
    """A re-iterable wrapper: `iter()` calls `fn(source)` afresh each epoch."""

    def __init__(self, source: object, fn: Callable[[object], Iterator]) -> None:
        self.source, self.fn = source, fn

    def __iter__(self) -> Iterator:
        return self.fn(self.source)
