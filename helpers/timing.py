"""Honest timing: d2l's `Timer`, and a `benchmark` that warms up, repeats and synchronises.

GPU work is queued asynchronously: a wall clock around `y = model(x)` measures the queueing, not
the work, so every clock here synchronises the device before it is read.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .checks import check_int, check_number
from .devices import accelerator, as_device, synchronize


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
    """Seconds per call: the median of the repeats, with the interquartile range as the spread.
    `window` (the shortest timed stretch, `number` calls) and `device` (whose work was timed)
    let a claim refuse a window too short to decide it (`helpers.suite.claims.WINDOW_FLOORS`)."""

    label: str
    median: float
    iqr: float
    min: float
    times: list[float]
    window: float | None = None  # seconds; None: the fastest repeat (one call per window)
    device: str | None = None  # "cpu", "cuda", ...; None: not known (a GPU was there)

    def __post_init__(self) -> None:
        if self.window is None:
            self.window = self.min

    @property
    def max(self) -> float:
        return max(self.times)

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


def measurement(
    times: list[float],
    label: str = "",
    *,
    window: float | None = None,
    device: str | torch.device | None = None,
) -> Measurement:
    """A `Measurement` of seconds timed elsewhere (a launched script's steps, a hand-timed loop),
    so a claim can judge them as it judges `benchmark`'s. `window`: seconds of the shortest timed
    stretch when it is not one of `times` (a per-epoch time scaled from fewer batches)."""
    if isinstance(times, str | bytes) or not isinstance(times, Iterable):
        raise TypeError(f"measurement: times must be a list of seconds, got {times!r}")
    times = list(times)
    if not times:
        raise ValueError("measurement: times must be a non-empty list of seconds, got []")
    for t in times:
        check_number("times", t, where="measurement", inclusive=True, what="seconds >= 0")
    times = [float(t) for t in times]
    check_number("window", window, where="measurement", allow_none=True)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    kind = torch.device(device).type if device is not None else None  # a label: not checked
    return Measurement(
        label, statistics.median(times), q[2] - q[0], min(times), times, window, kind
    )


class Ratio(float):
    """`a`'s time over `b`'s (a float: the ratio of the medians) that carries what decides whether
    a claim can rest on it: `low`..`high`, its range over the repeats, and `windows`, the
    (seconds, device) of the shortest timed stretch of each timing behind it. `timing.ratio`
    makes one; `1 - r` (a share of time saved) keeps them."""

    low: float
    high: float
    windows: tuple[tuple[float, str | None], ...]

    def __new__(
        cls, value: float, low: float, high: float, windows: tuple[tuple[float, str | None], ...]
    ) -> Ratio:
        for name, x in (("value", value), ("low", low), ("high", high)):
            check_number(name, x, where="Ratio", low=-math.inf, what="a finite number")
        low, high = min(low, high), max(low, high)
        if not low - 1e-9 * abs(low) <= value <= high + 1e-9 * abs(high):
            raise ValueError(f"Ratio: value {value} must lie in its range, {low} to {high}")
        windows = tuple(windows) if isinstance(windows, tuple | list) else ()
        if not windows or not all(isinstance(w, tuple) and len(w) == 2 for w in windows):
            raise ValueError(
                "Ratio: windows must be a non-empty tuple of (seconds, device) pairs, one per "
                "timing behind the ratio"
            )
        r = super().__new__(cls, value)
        r.low, r.high, r.windows = low, high, windows
        return r

    @property
    def window(self) -> float:
        """Seconds of the shortest timed stretch behind the ratio."""
        return min(s for s, _ in self.windows)

    def __getnewargs__(self) -> tuple:  # copy and pickle build it again with its range
        return float(self), self.low, self.high, self.windows

    def __rsub__(self, other: float) -> Ratio:
        return Ratio(other - float(self), other - self.high, other - self.low, self.windows)


def ratio(a: Measurement | float | tuple, b: Measurement | float | tuple) -> Ratio:
    """How many times `a`'s time is `b`'s: the ratio of the medians, with its range over the repeats
    (a's fastest / b's slowest to a's slowest / b's fastest) and the windows behind it. `a` or `b`
    may be a tuple of measurements that add up (a pipeline's stages), or a number: the seconds of
    one timed window (no repeats: no range; the device is not known)."""
    parts = []
    for name, side in (("a", a), ("b", b)):
        side = side if isinstance(side, tuple) and side else (side,)
        for s in side:
            if not isinstance(s, Measurement | int | float) or isinstance(s, bool):
                raise TypeError(
                    f"ratio: {name} must be a timing.Measurement, seconds, or a tuple of them; "
                    f"got {s!r}"
                )
        parts.append([s if isinstance(s, Measurement) else measurement([s]) for s in side])
    (num, den), total = parts, lambda ms, f: sum(f(m) for m in ms)
    if total(den, lambda m: m.min) <= 0:
        raise ValueError("ratio: b's times include 0 s: nothing to divide by; time more work")
    median, low, high = (
        total(num, lambda m: m.median) / total(den, lambda m: m.median),
        total(num, lambda m: m.min) / total(den, lambda m: m.max),
        total(num, lambda m: m.max) / total(den, lambda m: m.min),
    )
    return Ratio(median, low, high, tuple((m.window, m.device) for m in num + den))


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
    device: str | torch.device | None = None,
) -> Measurement:
    """Seconds per call of `fn()`: `warmup` untimed calls, then `repeats` timed runs of `number`
    calls, each timed by a `Timer` (`device` synchronised; None: every GPU). `device` also names
    whose work was timed, for the claims' window floors (None on a machine without a GPU: the CPU).

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
    timer = Timer(device)  # None: synchronises every GPU: queued kernels are counted
    for _ in range(repeats):
        timer.start()
        for _ in range(number):
            fn()
        timer.stop()
    kind = timer.device.type if timer.device is not None else None if accelerator() else "cpu"
    return measurement(
        [t / number for t in timer.times],
        label or getattr(fn, "__name__", "fn"),
        window=min(timer.times),
        device=kind,
    )
