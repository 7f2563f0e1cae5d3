"""Honest timing: d2l's `Timer`, and a `benchmark` that warms up, repeats and synchronises.

GPU work is queued asynchronously: a wall clock around `y = model(x)` measures the queueing, not
the work, so every clock here synchronises the device before it is read.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .checks import check_int, check_number
from .devices import as_device, synchronize


class Timer:
    """d2l's `Timer` (it starts at once; `start()`/`stop()` append to `times`), synchronising the
    device, and a context manager: `with t: work()`."""

    def __init__(self, device: str | torch.device | None = None) -> None:
        # None: synchronise every GPU there is; a device is checked now, not at the first stop()
        self.device = as_device(device, "Timer: device") if device is not None else None
        self.times: list[float] = []
        self._tik: float | None = None
        self.start()

    def start(self) -> None:
        synchronize(self.device)
        self._tik = time.perf_counter()

    def stop(self) -> float:
        if self._tik is None:
            raise RuntimeError("Timer.stop() called before start()")
        synchronize(self.device)
        self.times.append(time.perf_counter() - self._tik)
        self._tik = None
        return self.times[-1]

    def __enter__(self) -> Timer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Measurement:
    """Seconds per call: the median of the repeats, with the interquartile range as the spread."""

    label: str
    median: float
    iqr: float
    min: float
    times: list[float]

    def per_second(self, items: float) -> float:
        """Throughput when one call processes `items` items (samples, bytes, ...)."""
        check_number("items", items, where="per_second", inclusive=True)  # items per call
        if self.median <= 0:
            raise ValueError(
                f"per_second: {self.label!r} has a median of {self.median} s, too short to "
                "turn into a rate; time more work per call (benchmark(number=...))"
            )
        return items / self.median

    def __str__(self) -> str:
        return (
            f"{self.label}: {_fmt(self.median)} median (IQR {_fmt(self.iqr)}, n={len(self.times)})"
        )


def _fmt(seconds: float) -> str:
    return (
        f"{seconds:.3f} s"
        if seconds >= 1
        else f"{seconds * 1e3:.2f} ms"
        if seconds >= 1e-3
        else f"{seconds * 1e6:.1f} us"
    )


def benchmark(
    fn: Callable[[], object],
    *,
    repeats: int = 5,
    warmup: int = 1,
    number: int = 1,
    label: str | None = None,
) -> Measurement:
    """Seconds per call of `fn()`: `warmup` untimed calls, then `repeats` timed runs of `number`
    calls, each timed by a `Timer` (the GPUs synchronised).

    Not `torch.utils.benchmark.Timer.timeit` (which the doctor uses for one small op): each call
    of it first runs `max(number // 100, 2)` untimed calls, three times the work when `fn` is an
    epoch; its one-thread default is not the obstacle (`num_threads=` sets it). Source:
    https://github.com/pytorch/pytorch/blob/v2.14.0/torch/utils/benchmark/utils/timer.py
    """
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0), ("number", number, 1)):
        check_int(name, value, low, where="benchmark")
    if not callable(fn):
        raise TypeError(f"benchmark: fn must be callable, got {type(fn).__name__}")
    for _ in range(warmup):
        fn()
    timer = Timer()  # synchronises every GPU: queued kernels are counted
    for _ in range(repeats):
        timer.start()
        for _ in range(number):
            fn()
        timer.stop()
    times = [t / number for t in timer.times]
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return Measurement(
        label or getattr(fn, "__name__", "fn"),
        statistics.median(times),
        q[2] - q[0],
        min(times),
        times,
    )
