"""More intra-op threads speed up a big matmul on free cores (notebook 04, section 2).

The notebook prints this comparison instead of asserting it: beside another notebook (two run
at once in `make notebooks`) a core can be taken during its sweep, and two threads then wait at
a barrier for a partner that is not running. `make benchmarks` runs alone, so here it is a test.
"""

from __future__ import annotations

import pytest
import torch

from helpers import devices, timing

pytestmark = pytest.mark.benchmark

LEAST_GAIN = 1.15  # 2 threads on 2 free cores: well short of 2x, well above noise


def test_a_big_matmul_gains_from_the_free_cores():
    free = devices.free_cores()
    if free < 2:
        pytest.skip(
            f"{free} free core(s) of {devices.usable_cores()}: nothing to split a matmul over"
        )
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    seconds = {}
    for threads in (1, free):
        with devices.cpu_threads(threads):
            seconds[threads] = timing.benchmark(lambda: a @ b, warmup=2, repeats=7).median
    gain = seconds[1] / seconds[free]
    print(f"\n1024x1024 matmul: {free} threads {gain:.2f}x one thread's speed")
    assert gain >= LEAST_GAIN, (
        f"{free} threads on {free} free cores: {gain:.2f}x one thread's speed"
    )
