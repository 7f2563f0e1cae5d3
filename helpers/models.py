"""Dive into Deep Learning's ResNet-18 (`d2l.torch.resnet18`), written with eager layers.

d2l builds it from `LazyConv2d` / `LazyBatchNorm2d`, whose shapes are only known after a first
forward pass. That gets in the way of `channels_last`, `torch.compile`, DDP and state-dict
loading, so here every layer is built with its input size. Parameter names, shapes and the
forward computation are d2l's: a state dict loads from one into the other, both ways.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .checks import check_int


class Residual(nn.Module):
    """d2l's residual block: conv-bn-relu-conv-bn, plus an optional 1x1 conv shortcut."""

    def __init__(self, in_channels: int, num_channels: int, use_1x1conv: bool = False,
                 strides: int = 1) -> None:
        for name, v in (("in_channels", in_channels), ("num_channels", num_channels), ("strides", strides)):
            check_int(name, v, 1, where="Residual")
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, num_channels, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, kernel_size=3, padding=1)
        self.conv3 = (nn.Conv2d(in_channels, num_channels, kernel_size=1, stride=strides)
                      if use_1x1conv else None)
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3 is not None:
            X = self.conv3(X)
        return F.relu(Y + X)


def _resnet_block(in_channels: int, out_channels: int, num_residuals: int,
                  first_block: bool = False) -> nn.Sequential:
    blk = []
    for i in range(num_residuals):
        if i == 0 and not first_block:
            blk.append(Residual(in_channels, out_channels, use_1x1conv=True, strides=2))
        else:
            blk.append(Residual(out_channels, out_channels))
    return nn.Sequential(*blk)


def resnet18(num_classes: int = 10, in_channels: int = 1, width: int = 64) -> nn.Sequential:
    """The d2l ResNet-18 (3x3 stem, no max-pool). `width=64` is d2l's; smaller widths shrink
    every layer proportionally for quick CPU runs (the parameter names stay the same)."""
    for name, v in (("num_classes", num_classes), ("in_channels", in_channels), ("width", width)):
        check_int(name, v, 1, where="resnet18")
    w = width
    net = nn.Sequential(
        nn.Conv2d(in_channels, w, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(w),
        nn.ReLU(),
    )
    net.add_module("resnet_block1", _resnet_block(w, w, 2, first_block=True))
    net.add_module("resnet_block2", _resnet_block(w, 2 * w, 2))
    net.add_module("resnet_block3", _resnet_block(2 * w, 4 * w, 2))
    net.add_module("resnet_block4", _resnet_block(4 * w, 8 * w, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(8 * w, num_classes)))
    return net


def small_cnn(in_channels: int = 3, num_classes: int = 10, width: int = 16) -> nn.Sequential:
    """conv-bn-relu x3 with pooling, then a linear layer: trains in seconds on 32x32 images."""
    for name, v in (("in_channels", in_channels), ("num_classes", num_classes), ("width", width)):
        check_int(name, v, 1, where="small_cnn")
    w = width

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(*block(in_channels, w), nn.MaxPool2d(2), *block(w, 2 * w), nn.MaxPool2d(2),
                         *block(2 * w, 4 * w), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4 * w, num_classes))
