"""A small CNN and a bare training loop, for experiments that need *a* model trained the same
way twice (claims L6 and L7), not the suite's full training loop.

    net = small_cnn(width=16)
    train_steps(net, batches, steps=100, lr=0.05, device=dev)
    accuracy(net, x_test_uint8, y_test, device=dev)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn
from torch.nn import functional as F

from .device_augment import DeviceAugment
from .devices import as_device


def small_cnn(in_channels: int = 3, num_classes: int = 10, width: int = 16) -> nn.Sequential:
    """conv-bn-relu x3 with pooling, then a linear layer: trains in seconds on 32x32 images."""
    for name, v in (("in_channels", in_channels), ("num_classes", num_classes), ("width", width)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"small_cnn: {name} must be a positive int, got {v!r}")
    w = width

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(*block(in_channels, w), nn.MaxPool2d(2), *block(w, 2 * w), nn.MaxPool2d(2),
                         *block(2 * w, 4 * w), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4 * w, num_classes))


def train_steps(net: nn.Module, batches: Iterable, *, steps: int, lr: float = 0.05,
                device: str | torch.device = "cpu", momentum: float = 0.9) -> list[float]:
    """SGD with momentum for `steps` steps over `batches` (an iterable of (X, y), re-iterated
    when it runs out); returns the loss of every step."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"train_steps: steps must be an int >= 1, got {steps!r}")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"train_steps: lr must be a positive finite number, got {lr!r}")
    dev = as_device(device)
    net.to(dev).train()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    losses: list[float] = []
    while len(losses) < steps:
        seen = 0
        for X, y in batches:
            X, y = X.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            loss = F.cross_entropy(net(X), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            seen += 1
            if len(losses) >= steps:
                break
        if seen == 0:
            raise ValueError("train_steps: batches yielded nothing")
    return losses


@torch.no_grad()
def accuracy(net: nn.Module, x_uint8: torch.Tensor, y: torch.Tensor, *,
             device: str | torch.device = "cpu", batch_size: int = 1000,
             mean: tuple[float, ...] | None = None, std: tuple[float, ...] | None = None) -> float:
    """Accuracy on uint8 images (N, C, H, W), normalised like training, without augmentation."""
    dev = as_device(device)  # a clear error for 'cuda' on a machine without one
    kwargs = {} if mean is None else {"mean": mean, "std": std}
    norm = DeviceAugment(pad=0, crop=x_uint8.shape[-1], flip=False, **kwargs)
    net.to(dev).eval()
    correct = 0
    for i in range(0, len(x_uint8), batch_size):
        X = norm(x_uint8[i:i + batch_size].to(dev))
        correct += (net(X).argmax(1).cpu() == y[i:i + batch_size]).sum().item()
    return correct / len(x_uint8)
