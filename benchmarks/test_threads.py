"""More intra-op threads speed up a big matmul on free cores (notebook 05, section 2).

The notebook prints this comparison instead of asserting it: beside another notebook (two run
at once in `make notebooks`) a core can be taken during its sweep, and two threads then wait at
a barrier for a partner that is not running. `make benchmarks` runs alone, so here it is a test.

A program that starts for a second elsewhere on the machine still takes a core from one of the
two measurements and not the other (a 2-core CI machine measured 0.99x once). So one and all
free threads are timed in alternation, up to `ROUNDS` times, each credited with its best median
(the `timeit` rule: noise only ever adds time), and the free cores are counted before each round.
"""

from __future__ import annotations

import pytest
import torch

from helpers import devices, timing

pytestmark = pytest.mark.benchmark

LEAST_GAIN = 1.15  # 2 threads on 2 free cores: well short of 2x, well above noise
ROUNDS = 5  # stops at the first round that reaches the gain: one round on a quiet machine


def test_a_big_matmul_gains_from_the_free_cores():
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    best: dict[int, float] = {}
    most_free = 1
    for _ in range(ROUNDS):
        free = devices.free_cores()
        most_free = max(most_free, free)
        if free < 2:
            continue
        for threads in (1, free):
            with devices.cpu_threads(threads):
                median = timing.benchmark(lambda: a @ b, warmup=2, repeats=7).median
            best[threads] = min(best.get(threads, median), median)
        gain = best[1] / min(s for t, s in best.items() if t > 1)
        print(f"\n1024x1024 matmul: {free} threads {gain:.2f}x one thread's speed")
        if gain >= LEAST_GAIN:
            break
    if most_free < 2:
        pytest.skip(f"never 2 free cores of {devices.usable_cores()}: nothing to split over")
    assert gain >= LEAST_GAIN, (
        f"{most_free} threads on {most_free} free cores: {gain:.2f}x one thread's speed"
    )
