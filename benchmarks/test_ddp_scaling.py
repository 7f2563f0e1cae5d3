"""2-process DDP with one thread each vs one single-threaded process, on a compute-bound MLP
(notebook 16's training script, as its `%%writefile {TRAIN_PY}` cell writes it).

Weak scaling: every process trains on its own batch of the same size, so 2 processes do twice
the work per step; the ratio of samples/s is the speed-up. On 2 cores the ideal is 2x; the
gradient all-reduce (gloo over loopback) and the shared memory bandwidth take the rest.

How much a second process can add is the machine's, not DDP's: two cores that are hyperthreads
of one, a memory bus they share or other programs on the machine all cap it. So each round also
times the machine's own ceiling, two independent single-process runs at the same time (the same
work as DDP, no communication). The three configurations are measured in alternation, up to
`ROUNDS` times, each credited with its best step (the `timeit` rule: noise only ever adds time).
When even the independent pair stayed under `PAIR_NEEDED`x one process, the machine has no
second core to give and the test skips, saying so; otherwise DDP must reach `TARGET`x.
"""

from __future__ import annotations

import threading

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
    "1024",  # twice 512: the all-reduce a smaller share of the step
    "--steps-per-epoch",
    "8",
]
ROUNDS = 5  # stops at the first round that reaches the target: one round on a quiet machine
# 2 KVM cores, batch 1024: DDP 1.44-2.14x, the independent pair 1.76-2.51x (best of the rounds);
# the gloo threads of each rank share its core with the compute, so DDP stays under the pair
TARGET = 1.3
PAIR_NEEDED = 1.7  # two independent processes below this: no second core to scale onto


def best_samples_per_second(r: launch.RunResult) -> float:
    """Global samples/s of a run: ranks step together, so the slowest rank sets the pace; each
    rank's best step (after two warm-up steps) is its figure least disturbed by other programs."""
    step = max(min(res["step_times"][2:]) for res in r.results.values())
    return sum(res["batch"] for res in r.results.values()) / step


def single(script) -> float:
    return best_samples_per_second(
        launch.run(script, MODEL, nprocs=1, threads=1, stream=False, timeout=300)
    )


def independent_pair(script) -> float:
    """Samples/s of two single-process runs started together: the machine's 2-process ceiling."""
    rates = [0.0, 0.0]

    def one(i: int) -> None:
        rates[i] = single(script)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(rates), "an independent run did not report"
    return sum(rates)


@pytest.mark.benchmark
def test_two_processes_beat_one_by_1_3x(tmp_path):
    script = write_script("16_ddp.ipynb", "TRAIN_PY", tmp_path / "train_ddp.py")
    best = {"one": 0.0, "ddp": 0.0, "pair": 0.0}
    for _ in range(ROUNDS):
        best["one"] = max(best["one"], single(script))
        ddp = launch.run(script, MODEL, nprocs=2, threads=1, stream=False, timeout=300)
        best["ddp"] = max(best["ddp"], best_samples_per_second(ddp))
        best["pair"] = max(best["pair"], independent_pair(script))
        ratio, ceiling = best["ddp"] / best["one"], best["pair"] / best["one"]
        print(
            f"1 process: {best['one']:.0f} samples/s, DDP 2 processes: {best['ddp']:.0f} "
            f"({ratio:.2f}x), 2 independent processes: {best['pair']:.0f} ({ceiling:.2f}x)"
        )
        if ratio >= TARGET:
            break
    if ratio < TARGET and ceiling < PAIR_NEEDED:
        pytest.skip(
            f"two independent processes reached only {ceiling:.2f}x one (DDP {ratio:.2f}x): this "
            "machine gives a second process no core of its own to scale onto"
        )
    assert ratio >= TARGET, (
        f"2-process DDP reached only {ratio:.2f}x one process (want >= {TARGET}x) although two "
        f"independent processes reached {ceiling:.2f}x: the all-reduce costs too much"
    )
