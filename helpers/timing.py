"""Honest timing: a d2l-style `Timer` and a `benchmark` that warms up, repeats and synchronises.

GPU work is queued asynchronously: a wall-clock timer around `y = model(x)` on a GPU measures
the time to *queue* the kernels, not to run them. Every tool here synchronises the device
before reading the clock. `micro_benchmark` wraps `torch.utils.benchmark` for single small ops.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.utils.benchmark as tb

from .checks import check_int, check_number, check_seconds
from .devices import as_device, synchronize


class Timer:
    """Record several running times (d2l's `Timer`, plus device sync and a context manager).

    >>> t = Timer()             # starts at once, like d2l's
    >>> with t: work()          # or t.start(); work(); t.stop()
    >>> t.avg(), t.sum(), t.cumsum()
    """

    def __init__(self, device: str | torch.device | None = None) -> None:
        # None: synchronise every GPU there is; otherwise checked now, not at the first stop().
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

    def avg(self) -> float:
        return sum(self.times) / len(self.times) if self.times else 0.0

    def sum(self) -> float:
        return sum(self.times)

    def cumsum(self) -> list[float]:
        return np.array(self.times).cumsum().tolist()


@dataclass
class Measurement:
    """Seconds per call: median of `n` repeats, with the interquartile range as the spread."""

    label: str
    median: float
    iqr: float
    mean: float
    min: float
    n: int
    times: list[float]

    def per_second(self, items: float) -> float:
        """Throughput when one call processes `items` items (samples, bytes, ...)."""
        check_number("items", items, where="per_second", inclusive=True)  # items per call
        if self.median <= 0:
            raise ValueError(f"per_second: {self.label!r} has a median of {self.median} s, too short to "
                             "turn into a rate; time more work per call (benchmark(number=...))")
        return items / self.median

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.label}: {_fmt(self.median)} median (IQR {_fmt(self.iqr)}, n={self.n})"


def _synced_clock() -> float:
    """The clock `benchmark` reads: synchronise the GPU first, so queued kernels are counted."""
    synchronize()
    return time.perf_counter()


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def benchmark(
    fn: Callable[[], object],
    *,
    repeats: int = 5,
    warmup: int = 1,
    number: int = 1,
    label: str | None = None,
) -> Measurement:
    """Time `fn()`: `warmup` untimed calls, then `repeats` timed runs of `number` calls each.

    Returns seconds *per call*. Each timed run reads a clock that synchronises the GPU before
    reading the time (as torch.utils.benchmark's own clock does), so queued kernels are counted.

    Why not `torch.utils.benchmark.Timer.timeit` itself: it runs at least two hidden warm-up calls
    before every timed run and pins PyTorch to one thread by default - right for micro-benchmarks
    of one op, wrong for timing whole epochs at the machine's real thread count.
    """
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0), ("number", number, 1)):
        check_int(name, value, low, where="benchmark")
    if not callable(fn):
        raise TypeError(f"benchmark: fn must be callable, got {type(fn).__name__}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = _synced_clock()
        for _ in range(number):
            fn()
        times.append((_synced_clock() - t0) / number)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return Measurement(
        label=label or getattr(fn, "__name__", "fn"),
        median=statistics.median(times),
        iqr=q[2] - q[0],
        mean=statistics.fmean(times),
        min=min(times),
        n=repeats,
        times=times,
    )


def micro_benchmark(stmt: str, globals: dict | None = None, *, min_run_time: float = 0.2,
                    label: str = "") -> tb.Measurement:
    """For a single small op: torch.utils.benchmark's adaptive `blocked_autorange`, at this
    process's thread count (its default would pin to one thread)."""
    if not isinstance(stmt, str) or not stmt.strip():
        raise ValueError(f"micro_benchmark: stmt must be a non-empty string of code, got {stmt!r}")
    check_seconds("min_run_time", min_run_time, where="micro_benchmark")
    timer = tb.Timer(stmt=stmt, globals=globals or {}, num_threads=torch.get_num_threads(),
                     label=label or stmt)
    return timer.blocked_autorange(min_run_time=min_run_time)
