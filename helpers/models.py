"""d2l's ResNet-18 with eager layers, a small CNN, and what a training step costs in FLOPs.

d2l's lazy layers (`LazyConv2d`, shapes known after a first forward pass) get in the way of
`channels_last`, `torch.compile`, DDP and loading state dicts; here every layer knows its input
size, with d2l's names, shapes and forward pass: a state dict loads both ways.

    per_image = training_flops_per_sample(net, (1, 28, 28))   # forward + backward
    frac = fraction_of_peak(per_image * samples_per_s, device_name(), "bf16")

`FlopCounterMode` counts matmuls and convolutions on a `meta`-device copy; element-wise work is
not counted, so the fraction slightly under-states what the device does. Peaks are dense
tensor-core datasheet figures (`PEAK_SOURCE`); a GPU missing from the table gets None.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from .checks import check_choice, check_int, check_number

PRECISIONS = ("bf16", "fp16", "tf32", "fp32")
PEAK_SOURCE = (
    "NVIDIA datasheets (dense tensor-core TFLOP/s, without sparsity): H100/H200, "
    "A100, V100, T4, A10, L4, L40S, B200 (HGX, per GPU) datasheets; GA102/AD102 "
    "whitepapers for RTX 3090/4090"
)


class Residual(nn.Module):
    """d2l's residual block: conv-bn-relu-conv-bn, plus an optional 1x1 conv shortcut."""

    def __init__(
        self, in_channels: int, num_channels: int, use_1x1conv: bool = False, strides: int = 1
    ) -> None:
        for name, v in (
            ("in_channels", in_channels),
            ("num_channels", num_channels),
            ("strides", strides),
        ):
            check_int(name, v, 1, where="Residual")
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, num_channels, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, kernel_size=3, padding=1)
        self.conv3 = (
            nn.Conv2d(in_channels, num_channels, kernel_size=1, stride=strides)
            if use_1x1conv
            else None
        )
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3 is not None:
            X = self.conv3(X)
        return F.relu(Y + X)


def _resnet_block(in_channels: int, out_channels: int, first_block: bool = False) -> nn.Sequential:
    """d2l's two residuals; every block but the first halves the size and widens."""
    if first_block:
        return nn.Sequential(
            Residual(out_channels, out_channels), Residual(out_channels, out_channels)
        )
    return nn.Sequential(
        Residual(in_channels, out_channels, use_1x1conv=True, strides=2),
        Residual(out_channels, out_channels),
    )


def resnet18(num_classes: int = 10, in_channels: int = 1, width: int = 64) -> nn.Sequential:
    """The d2l ResNet-18 (3x3 stem, no max-pool). `width=64` is d2l's; smaller widths shrink
    every layer proportionally for quick CPU runs (the parameter names stay the same)."""
    for name, v in (("num_classes", num_classes), ("in_channels", in_channels), ("width", width)):
        check_int(name, v, 1, where="resnet18")
    w = width
    net = nn.Sequential(
        nn.Conv2d(in_channels, w, kernel_size=3, stride=1, padding=1), nn.BatchNorm2d(w), nn.ReLU()
    )
    net.add_module("resnet_block1", _resnet_block(w, w, first_block=True))
    net.add_module("resnet_block2", _resnet_block(w, 2 * w))
    net.add_module("resnet_block3", _resnet_block(2 * w, 4 * w))
    net.add_module("resnet_block4", _resnet_block(4 * w, 8 * w))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(8 * w, num_classes)))
    return net


# oneDNN's CPU backward of a 1x1 strided convolution in channels_last writes past its workspace
# when the input has fewer channels than its block (8 with AVX2): a crash, a hang or wrong
# gradients (https://github.com/uxlfoundation/oneDNN/issues/6035; torch 2.14.1 here crashed at
# 1 to 4 channels). ResNet-18's first downsampling shortcut takes `width` channels.
CPU_CHANNELS_LAST_MIN_WIDTH = 8


def check_channels_last_width(width: int, device: str | torch.device, param: str = "WIDTH") -> int:
    """`width`, or a ValueError naming `param` where training resnet18(width) in channels_last
    would crash the kernel: on a CPU below CPU_CHANNELS_LAST_MIN_WIDTH."""
    check_int(param, width, 1, where="check_channels_last_width")
    if torch.device(device).type == "cpu" and width < CPU_CHANNELS_LAST_MIN_WIDTH:
        raise ValueError(
            f"{param} must be >= {CPU_CHANNELS_LAST_MIN_WIDTH} on a CPU, got {width}: oneDNN's "
            "channels_last backward of the 1x1 strided shortcut convolution crashes below it"
        )
    return width


def small_cnn(in_channels: int = 3, num_classes: int = 10, width: int = 16) -> nn.Sequential:
    """conv-bn-relu x3 with pooling, then a linear layer: trains in seconds on 32x32 images."""
    for name, v in (("in_channels", in_channels), ("num_classes", num_classes), ("width", width)):
        check_int(name, v, 1, where="small_cnn")
    w = width

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *block(in_channels, w),
        nn.MaxPool2d(2),
        *block(w, 2 * w),
        nn.MaxPool2d(2),
        *block(2 * w, 4 * w),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * w, num_classes),
    )


# (regex on torch.cuda.get_device_name(), {precision: dense TFLOP/s}); first match wins, so the
# more specific names come first. None = the card has no such hardware path (bf16 and TF32 on a
# V100 or T4), except the B200's fp32: it has FP32 units, but this table holds no plain-FP32 peak
# sourced from NVIDIA's B200 datasheet, so fraction_of_peak says "unknown" rather than guess.
# V100 (https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf):
# the PCIe card ("Tesla V100-PCIE-16GB") clocks lower than the SXM2 module: 14 / 112 TFLOP/s
# fp32 / fp16 tensor against 15.7 / 125; other V100 names (V100S, FHHL, SXM3) are not in it.
PEAK_TFLOPS: list[tuple[str, dict[str, float | None]]] = [
    (r"B200", {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": None}),
    (r"H100.*PCIe", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    (r"H100.*NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H100|H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # H100 SXM5, H200
    (r"A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (r"V100-PCIE", {"bf16": None, "fp16": 112.0, "tf32": None, "fp32": 14.0}),
    (r"V100-SXM2", {"bf16": None, "fp16": 125.0, "tf32": None, "fp32": 15.7}),
    (r"\bT4\b", {"bf16": None, "fp16": 65.0, "tf32": None, "fp32": 8.1}),
    (r"RTX 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    (r"RTX 3090", {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6}),
]


def peak_flops(device_name: str, precision: str = "bf16") -> float | None:
    """Dense peak FLOP/s of the GPU called `device_name` at `precision`, or None when unknown
    (a CPU, a GPU missing from the table, or a precision the card has no hardware for)."""
    check_choice("precision", precision, PRECISIONS, where="peak_flops")
    if not isinstance(device_name, str):
        raise TypeError(
            f"device_name must be a string such as 'NVIDIA H100 80GB HBM3', got {device_name!r}"
        )
    tflops = next(
        (peaks[precision] for pattern, peaks in PEAK_TFLOPS if re.search(pattern, device_name)),
        None,
    )
    return None if tflops is None else tflops * 1e12


def fraction_of_peak(
    flops_per_second: float, device_name: str, precision: str = "bf16"
) -> float | None:
    """Achieved FLOP/s over the card's datasheet peak (None when the peak is unknown)."""
    check_number("flops_per_second", flops_per_second, where="fraction_of_peak", inclusive=True)
    peak = peak_flops(device_name, precision)
    return None if peak is None else flops_per_second / peak


def training_flops_per_sample(
    model: nn.Module,
    sample_shape: Sequence[int],
    *,
    loss_fn: Callable | None = None,
    batch: int = 2,
) -> float:
    """FLOPs of one forward + backward pass per sample (what one training image costs).

    Counted on a `meta`-device copy: milliseconds and no memory, whatever the model."""
    check_int("batch", batch, 1, where="training_flops_per_sample")
    if not sample_shape or any(not isinstance(s, int) or s < 1 for s in sample_shape):
        raise ValueError(
            f"sample_shape must be positive ints like (1, 28, 28), got {sample_shape!r}"
        )
    if isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
        model = model.module
    net = copy.deepcopy(model).to("meta").train()
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    X = torch.empty((batch, *sample_shape), device="meta")
    y = torch.zeros(batch, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        loss_fn(net(X), y).backward()
    return counter.get_total_flops() / batch
