"""Is the loop waiting for data? Time spent in `next(batch)` vs time spent in the step.

    meter = DataWaitMeter(loader, device=device)
    for X, y in meter:
        train_step(X, y)
    print(meter.summary())   # {'wait_s': ..., 'compute_s': ..., 'wait_fraction': 0.68, ...}
    meter.summary(skip=1)    # steady state: without the first step (worker start-up)

The step's share is measured up to the next `next()` call, after synchronising the device, so
queued GPU work is charged to the step and not to the data. Pass `sync_every=k` to synchronise
only every k steps (fewer stalls; then per-step split is approximate, the totals stay right).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .devices import as_device, synchronize


class DataWaitMeter:
    def __init__(self, iterable: Iterable, *, device: str | torch.device | None = None,
                 sync_every: int = 1) -> None:
        if not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError(f"DataWaitMeter: sync_every must be an int >= 1, got {sync_every!r}")
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
        if not isinstance(skip, int) or skip < 0:
            raise ValueError(f"DataWaitMeter.summary: skip must be an int >= 0, got {skip!r}")
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
        """One sentence for the notebook: is this loop input-bound?"""
        s = self.summary(skip)
        pct = 100 * s["wait_fraction"]
        if pct >= 30:
            return (f"{pct:.0f} % of step time is waiting for data: the loop is input-bound - "
                    "add DataLoader workers, keep data in memory, or move augmentation to the device.")
        if pct >= 10:
            return f"{pct:.0f} % of step time is waiting for data: input is a noticeable but not dominant cost."
        return f"only {pct:.0f} % of step time is waiting for data: the loop is compute-bound."
