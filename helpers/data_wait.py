"""Is the loop waiting for data? Time spent in `next(batch)` vs time spent in the step.

    meter = DataWaitMeter(loader, device=device)
    for X, y in meter:
        train_step(X, y)
    print(meter.summary())   # {'wait_s': ..., 'compute_s': ..., 'wait_fraction': 0.68, ...}
    meter.summary(skip=1)    # steady state: without the first step (worker start-up)

The step's share is measured up to the next `next()` call, after synchronising the device, so
queued GPU work is charged to the step and not to the data. Pass `sync_every=k` to synchronise
only every k steps (fewer stalls; then per-step split is approximate, the totals stay right).

`wait_verdict` is the one input-bound rule: `DataWaitMeter.diagnosis` says it in words, and
notebook 11 reads its `INPUT_BOUND` threshold. Notebook 02 writes the same measurement out as a
loop of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .checks import check_int
from .devices import as_device, synchronize

INPUT_BOUND = 0.30  # at least this share of step time waiting for data: the loop is input-bound
NOTICEABLE = 0.10   # at least this share: a cost worth knowing, not yet the bottleneck


def wait_verdict(wait_fraction: float) -> tuple[str, str]:
    """(kind, sentence) for a share of step time spent waiting for data; kind is
    'input-bound', 'noticeable' or 'not input-bound'."""
    if (not isinstance(wait_fraction, int | float) or isinstance(wait_fraction, bool)
            or not 0.0 <= wait_fraction <= 1.0 + 1e-6):
        raise ValueError(f"wait_verdict: wait_fraction must be a fraction in [0, 1], got {wait_fraction!r}")
    pct = 100 * wait_fraction
    if wait_fraction >= INPUT_BOUND:
        return "input-bound", (
            f"{pct:.0f} % of step time is waiting for data: the loop is input-bound (I/O or CPU "
            "preprocessing). Add DataLoader workers, keep the data in memory as uint8, or move "
            "augmentation to the device; a faster model will not help.")
    if wait_fraction >= NOTICEABLE:
        return "noticeable", (f"{pct:.0f} % of step time is waiting for data: input is a noticeable "
                              "but not dominant cost.")
    return "not input-bound", (f"only {pct:.0f} % of step time is waiting for data: the loop is "
                               "compute-bound.")


class DataWaitMeter:
    def __init__(self, iterable: Iterable, *, device: str | torch.device | None = None,
                 sync_every: int = 1) -> None:
        check_int("sync_every", sync_every, where="DataWaitMeter")
        if not isinstance(iterable, Iterable):
            raise TypeError(f"DataWaitMeter: iterable must be iterable (a DataLoader, a list of batches, ...), "
                            f"got {type(iterable).__name__}")
        self.iterable = iterable
        self.device = as_device(device, "DataWaitMeter: device") if device is not None else None
        self.sync_every = sync_every
        self.wait: list[float] = []
        self.compute: list[float] = []

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.iterable)
        step = 0
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            t1 = time.perf_counter()
            self.wait.append(t1 - t0)
            yield batch
            step += 1
            if step % self.sync_every == 0:
                synchronize(self.device)
            self.compute.append(time.perf_counter() - t1)

    def summary(self, skip: int = 0) -> dict[str, float]:
        """Totals over the steps; `skip=k` leaves out the first k steps (the first `next()` of a
        DataLoader also starts its worker processes, which is not a steady-state wait)."""
        check_int("skip", skip, 0, where="DataWaitMeter.summary")
        wait, compute = sum(self.wait[skip:len(self.compute)]), sum(self.compute[skip:])
        total = wait + compute
        steps = max(0, len(self.compute) - skip)
        return {
            "steps": steps,
            "step_s": total / steps if steps else 0.0,
            "wait_s": wait,
            "compute_s": compute,
            "wait_fraction": wait / total if total else 0.0,
        }

    def diagnosis(self, skip: int = 0) -> str:
        """One sentence for the notebook: is this loop input-bound? (`wait_verdict`)"""
        return wait_verdict(self.summary(skip)["wait_fraction"])[1]
