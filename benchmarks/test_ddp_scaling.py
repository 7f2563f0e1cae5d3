"""2-process DDP with one thread each vs one single-threaded process, on a compute-bound MLP
(notebook 14's training script, as its `%%writefile {TRAIN_PY}` cell writes it).

Weak scaling: every process trains on its own batch of the same size, so 2 processes do twice
the work per step; the ratio of samples/s is the speed-up. On 2 cores the ideal is 2x; the
gradient all-reduce (gloo over loopback) and the shared memory bandwidth take the rest.

The machine may be shared with other programs, which steal cores from one configuration and
not the other. So the two configurations are measured in alternation, up to `ROUNDS` times,
and each is credited with its best step (the `timeit` rule: noise only ever adds time). A
speed-up from a second core needs a second core that is free: when other programs kept more
than a quarter of the machine busy all the while (measured between rounds, while this test
runs nothing), the ratio says nothing about DDP, and the test skips, saying how busy it was.
"""

from __future__ import annotations

import psutil
import pytest

from helpers import launch
from tests.notebook_scripts import write_script

MODEL = [
    "--in-features",
    "256",
    "--hidden",
    "1024",
    "--depth",
    "3",
    "--batch",
    "512",
    "--steps-per-epoch",
    "8",
]
ROUNDS = 5  # stops at the first round that reaches the target: costs nothing on a quiet machine
TARGET = 1.5
BUSY_ELSEWHERE = 0.25  # share of all cores other programs used while this test was idle


def busy_elsewhere(seconds: float = 1.0) -> float:
    """Share of the machine's CPU in use while this process and its children sleep."""
    return psutil.cpu_percent(interval=seconds) / 100


def best_samples_per_second(r: launch.RunResult) -> float:
    """Global samples/s of a run: ranks step together, so the slowest rank sets the pace; each
    rank's best step (after two warm-up steps) is its figure least disturbed by other programs."""
    step = max(min(res["step_times"][2:]) for res in r.results.values())
    return sum(res["batch"] for res in r.results.values()) / step


@pytest.mark.benchmark
def test_two_processes_beat_one_by_1_5x(tmp_path):
    script = write_script("14_ddp.ipynb", "TRAIN_PY", tmp_path / "train_ddp.py")
    best = {1: 0.0, 2: 0.0}
    quietest = 1.0
    for _ in range(ROUNDS):
        quietest = min(quietest, busy_elsewhere())
        for n in (1, 2):
            r = launch.run(script, MODEL, nprocs=n, threads=1, stream=False, timeout=300)
            best[n] = max(best[n], best_samples_per_second(r))
        ratio = best[2] / best[1]
        print(
            f"1 process: {best[1]:.0f} samples/s, 2 processes: {best[2]:.0f} samples/s, "
            f"ratio {ratio:.2f}x"
        )
        if ratio >= TARGET:
            break
    if ratio < TARGET and quietest > BUSY_ELSEWHERE:
        pytest.skip(
            f"other programs kept {quietest:.0%} of the cores busy even at the quietest moment "
            f"(ratio {ratio:.2f}x): 2-process scaling needs a second free core"
        )
    assert ratio >= TARGET, (
        f"2-process DDP reached only {ratio:.2f}x one process (want >= {TARGET}x)"
    )
