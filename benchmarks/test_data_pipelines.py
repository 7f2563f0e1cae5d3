"""The GPU data pipelines' performance bar: (c) data resident on the device + batched augmentation feeds at
least 10x as many samples/s as (a) the PNG + DataLoader pipeline at its best worker count
(on a CPU-only machine; >= 50x on a GPU). Ratios only, never absolute times.

    FTG_PROFILE=smoke .venv/bin/pytest -q -m benchmark benchmarks/test_data_pipelines.py
"""

from __future__ import annotations

import os

import pytest
import torch

from helpers import data, device_augment, devices, pipelines, threads, timing

N = 2048
BATCH = 128


def _rates(device: torch.device) -> tuple[float, float, int]:
    root, _ = pipelines.prepare_image_folder(N, fmt="png")
    ds = pipelines.image_folder(root, transform=pipelines.cifar_train_transform())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rate_a = {}
    with threads.cpu_threads(1):  # input work runs on one thread, as in DataLoader workers
        for k in sorted({0, cores} | {2**i for i in range(8) if 2**i <= cores}):
            m = pipelines.time_loader(ds, batch_size=BATCH, num_workers=k, repeats=3,
                                      prefetch_factor=2 if k else None, device=device)
            rate_a[k] = m.per_second(N)
        x, y = data.as_tensors(data.cifar10(train=True), limit=N)
        aug = device_augment.DeviceAugment(pad=4, crop=32, flip=True, seed=0)
        batches = device_augment.TensorBatches(x, y, BATCH, augment=aug, device=device)
        m_c = timing.benchmark(lambda: pipelines.consume(batches), repeats=9, warmup=2)
    best = max(rate_a, key=rate_a.get)
    return rate_a[best], m_c.per_second(N), best


@pytest.mark.benchmark
def test_device_resident_batched_augmentation_is_10x_the_cpu_pipeline():
    device = devices.try_gpu()
    rate_a, rate_c, best = _rates(device)
    ratio = rate_c / rate_a
    target = 50 if device.type == "cuda" else 10
    print(f"(a) {rate_a:.0f} samples/s at {best} workers; (c) {rate_c:.0f} samples/s on "
          f"{devices.device_name(device)}: {ratio:.1f}x (target >= {target}x)")
    assert ratio >= target, f"(c)/(a) = {ratio:.1f}x, below the {target}x target on {device}"
