"""2-process DDP with one thread each vs one single-threaded process, on a compute-bound MLP.

Weak scaling: every process trains on its own batch of the same size, so 2 processes do twice
the work per step; the ratio of samples/s is the speed-up. On 2 cores the ideal is 2x; the
gradient all-reduce (gloo over loopback) and the shared memory bandwidth take the rest.
"""

from __future__ import annotations

import pytest

from helpers import launch

MODEL = ["--in-features", "256", "--hidden", "1024", "--depth", "3", "--batch", "512",
         "--steps-per-epoch", "8", "--warmup", "2"]


def samples_per_second(r: launch.LaunchResult) -> float:
    """Global samples/s: all ranks step together, so the slowest rank sets the pace; the best step of each
    rank (like `timeit`) is the figure least disturbed by other programs on a shared machine."""
    step = max(min(res["step_times"][2:]) for res in r.results.values())
    return sum(res["batch"] for res in r.results.values()) / step


@pytest.mark.benchmark
def test_two_processes_beat_one_by_1_5x():
    one = launch.launch("helpers.ddp_train", MODEL, nprocs=1, threads=1, backend="gloo",
                        stream=False, timeout=300)
    two = launch.launch("helpers.ddp_train", MODEL, nprocs=2, threads=1, backend="gloo",
                        stream=False, timeout=300)
    ratio = samples_per_second(two) / samples_per_second(one)
    print(f"1 process: {samples_per_second(one):.0f} samples/s, "
          f"2 processes: {samples_per_second(two):.0f} samples/s, ratio {ratio:.2f}x")
    assert ratio >= 1.5, f"2-process DDP reached only {ratio:.2f}x one process (want >= 1.5x)"
