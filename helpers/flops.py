"""How much arithmetic a training step does, and how close a run gets to the device's peak.

    per_image = training_flops_per_sample(net, (1, 28, 28))   # forward + backward, counted
    frac = fraction_of_peak(per_image * samples_per_s, device_name(), "bf16")

FLOPs are counted by `torch.utils.flop_counter.FlopCounterMode` on a copy of the model on the
`meta` device (no memory, no real arithmetic): matrix multiplies and convolutions, forward and
backward, the operations that dominate a CNN. Element-wise work (batch norm, ReLU) is not
counted, so the fraction of peak is a slight under-estimate of what the device really does.

Peak figures are NVIDIA's datasheet numbers for *dense* tensor-core math (the "with sparsity"
figures are twice these and are not reachable by ordinary training). Sources:
  H100 / H200: NVIDIA H100 Tensor Core GPU datasheet (2023), NVIDIA H200 datasheet (2024)
  A100: NVIDIA A100 Tensor Core GPU datasheet (2021)
  V100: NVIDIA Tesla V100 datasheet (2020)
  T4, A10, L4, L40S: the NVIDIA product datasheets of each card
  RTX 3090 / 4090: NVIDIA Ampere GA102 and Ada Lovelace architecture whitepapers
  B200: NVIDIA Blackwell datasheet (HGX B200, per GPU)
A machine whose GPU is not in the table gets `None`: no fraction is shown rather than a guess.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .checks import check_choice, check_int, check_number

PRECISIONS = ("bf16", "fp16", "tf32", "fp32")
PEAK_SOURCE = ("NVIDIA datasheets (dense tensor-core TFLOP/s, without sparsity): H100/H200, "
               "A100, V100, T4, A10, L4, L40S datasheets; GA102/AD102 whitepapers for RTX 3090/4090")

# (regex on torch.cuda.get_device_name(), {precision: dense TFLOP/s}); first match wins, so the
# more specific names come first. None = the card has no such hardware path.
PEAK_TFLOPS: list[tuple[str, dict[str, float | None]]] = [
    (r"B200", {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": None}),
    (r"H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"H100.*PCIe", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    (r"H100.*NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM5
    (r"A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (r"V100", {"bf16": None, "fp16": 125.0, "tf32": None, "fp32": 15.7}),
    (r"\bT4\b", {"bf16": None, "fp16": 65.0, "tf32": None, "fp32": 8.1}),
    (r"RTX 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    (r"RTX 3090", {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6}),
]


def peak_flops(device_name: str, precision: str = "bf16") -> float | None:
    """Dense peak FLOP/s of the GPU called `device_name` at `precision`, or None when unknown
    (a CPU, a GPU missing from the table, or a precision the card has no hardware for)."""
    check_choice("precision", precision, PRECISIONS, where="peak_flops")
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a string such as 'NVIDIA H100 80GB HBM3', got {device_name!r}")
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_name):
            tf = peaks.get(precision)
            return None if tf is None else tf * 1e12
    return None


def fraction_of_peak(flops_per_second: float, device_name: str, precision: str = "bf16") -> float | None:
    """Achieved FLOP/s over the card's datasheet peak (None when the peak is unknown)."""
    check_number("flops_per_second", flops_per_second, where="fraction_of_peak", inclusive=True)
    peak = peak_flops(device_name, precision)
    return None if peak is None else flops_per_second / peak


def _unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DataParallel / DDP / torch.compile wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def training_flops_per_sample(model: nn.Module, sample_shape: Sequence[int], *,
                              loss_fn: Callable | None = None, num_classes: int = 10,
                              batch: int = 2) -> float:
    """FLOPs of one forward + backward pass per sample (what one training image costs).

    Counted on a `meta`-device copy, so it takes milliseconds and no memory whatever the model.
    """
    check_int("batch", batch, 1, where="training_flops_per_sample")
    if not sample_shape or any(not isinstance(s, int) or s < 1 for s in sample_shape):
        raise ValueError(f"sample_shape must be positive ints like (1, 28, 28), got {sample_shape!r}")
    net = copy.deepcopy(_unwrap(model)).to("meta").train()
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    X = torch.empty((batch, *sample_shape), device="meta")
    y = torch.zeros(batch, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        loss = loss_fn(net(X), y)
        loss.backward()
    return counter.get_total_flops() / batch
