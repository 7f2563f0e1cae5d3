"""The bottleneck doctor's two bars, as ratios measured in one run:

- its prediction: on notebook 20's broken loops (input-bound, overhead-bound), the speed-up its
  what-if predicts for the top fix is within 25 % of the speed-up measured when the fix is
  applied and the loop re-run (syncs counted on a CPU are not part of it: no cost is claimed);
- its own cost: watching adds at most 10 % to the step time outside the counting window, on a
  loop whose steps take >= 5 ms, from interleaved A/B pairs;
- its command-line what-if: `--what-if-loader` re-runs a script with workers, `--what-if` one
  with fewer intra-op threads, and the speed-up measured is within 25 % of the one predicted.

Prediction and re-run are interleaved too, and the median of the per-pair ratios is judged (not
the ratio of two medians), so that a machine whose load drifts (other programs, a CI box shared
with other jobs) moves both sides of a pair alike.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from helpers import doctor
from tests.test_doctor import Blurred, batched, tiny_ops_net
from tests.test_doctor_cli import INPUT_BOUND, OVERSUBSCRIBED, report

pytestmark = [pytest.mark.benchmark, pytest.mark.doctor]
PAIRS = 5
RUNS = 5  # broken-then-fixed pairs per loop; the tiny-op loop's speed drifts 2x between runs
PREDICTION_BAR = 0.25  # the doctor's promise: within 25 % of the re-measured speed-up
OVERHEAD_BAR = 0.10  # watching costs at most 10 % of a >= 5 ms step
MIN_STEP_S = 0.005


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops on a shared 2-core machine stall with 2 threads
    yield
    torch.set_num_threads(before)


def fit(batches, net, steps: int | None = None) -> list[float]:
    """The plain loop; returns each step's seconds (for the unwatched side of a pair)."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    times, t = [], time.perf_counter()
    for i, (X, y) in enumerate(batches):
        loss = F.cross_entropy(net(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        now = time.perf_counter()
        times.append(now - t)
        t = now
        if steps is not None and i + 1 >= steps:
            break
    return times


def watched(loader, net, **kw) -> doctor.Watch:
    w = doctor.watch(loader, quiet=True, timed=6, **kw)
    fit(w, net)
    return w


LOOPS = {
    # name: (broken loader, model, the fix applied: a loader, the finding)
    "input-bound": (
        lambda: DataLoader(Blurred(), batch_size=8),
        lambda: nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4, 10)),
        lambda k: DataLoader(Blurred(), batch_size=8, num_workers=k, persistent_workers=True),
        "input-bound",
    ),
    "overhead-bound": (
        lambda: batched(4096, 16, 4),
        tiny_ops_net,
        lambda k: batched(4096, 16, 8),
        "overhead-bound",
    ),
}


@pytest.mark.parametrize("name", list(LOOPS))
def test_predicted_speedup_is_within_25_percent_of_the_rerun(name):
    broken, model, fixed, kind = LOOPS[name]
    predicted, measured = [], []
    for _ in range(RUNS):
        w = watched(broken(), model())
        f = next(f for f in w.findings if f.kind == kind)
        predicted.append(f.predicted_speedup)
        after = watched(fixed(w.measured.cores), model(), what_if=False)
        measured.append(after.measured.samples_per_s / w.measured.samples_per_s)
    ratio = statistics.median(p / m for p, m in zip(predicted, measured, strict=True))
    print(
        f"{name}: predicted {[round(x, 2) for x in predicted]}, "
        f"re-run {[round(x, 2) for x in measured]}: median ratio {ratio:.2f}"
    )
    assert abs(ratio - 1) <= PREDICTION_BAR


def test_watching_costs_at_most_10_percent_of_a_5ms_step():
    net = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    plain, watched_s = [], []
    fit(batched(4096, 1024, 256), net, steps=5)  # warm-up
    for _ in range(PAIRS):  # interleaved A/B pairs
        plain.append(statistics.median(fit(batched(4096, 1024, 256), net, steps=12)[2:]))
        w = watched(batched(4096, 1024, 256), net, what_if=False)
        watched_s.append(w.measured.step_s)
    a = statistics.median(plain)
    cost = statistics.median(b / a for a, b in zip(plain, watched_s, strict=True))
    print(f"step {1e3 * a:.2f} ms plain; watched / plain per pair: median {cost:.3f}")
    assert a >= MIN_STEP_S, "the bar is about steps of 5 ms or more: make the loop heavier"
    assert cost <= 1 + OVERHEAD_BAR


WHAT_IFS = {
    # name: (script, flags): every sample a slow read (workers overlap the waits); two intra-op
    # threads beside two busy workers on 2 cores (the script sets its threads itself)
    "workers": (INPUT_BOUND, ["--what-if-loader"]),
    "threads": (OVERSUBSCRIBED, ["--what-if", "--steps", "60"]),
}


@pytest.mark.parametrize("name", list(WHAT_IFS))
def test_the_command_line_what_if_is_within_25_percent_of_its_prediction(name, tmp_path):
    """`--what-if` re-runs the script with the fix of the top finding it can act on: the speed-up it
    measures is within 25 % of the one it predicts (median over runs). Loading that is CPU work
    on a 2-core machine shares the cores with the loop and gains less than the workers
    prediction: not this bar's case; the threads case is exactly that sharing."""
    source, flags = WHAT_IFS[name]
    script = tmp_path / "train.py"
    script.write_text(source)
    ratios = []
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-m", "helpers.doctor", *flags, "--json", str(script)],
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        w = report(done.stdout)["what_if"]
        assert w.get("predicted_speedup") and w.get("measured_speedup"), w["text"]
        ratios.append(w["predicted_speedup"] / w["measured_speedup"])
    ratio = statistics.median(ratios)
    print(f"command-line what-if, {name}: predicted / measured {[round(r, 2) for r in ratios]}")
    assert abs(ratio - 1) <= PREDICTION_BAR
