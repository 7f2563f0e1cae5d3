"""Where does a running loop's time go, and what bounds it? The suite's one classifier.

    meter = DataWaitMeter(loader, device=device)
    for X, y in meter:
        train_step(X, y)
    meter.summary(skip=1)   # {'wait_s', 'compute_s', 'wait_fraction', ...} past worker start-up
    meter.diagnosis()       # in words, by `wait_verdict`: the input-bound rule alone
    bottleneck(data_wait=0.01, busy=0.9).kind   # 'device-bound': one verdict from the shares

A step is timed up to the next `next()`, after a device sync, so queued GPU work is charged to
the step, not the data (`sync_every=k`: fewer stalls, the totals stay right). `StepWindow` is
notebook 04's profiler schedule as a per-step hook, for the loops notebook 19 writes in its cells.
`bottleneck` names what bounds a loop from its measured shares of the step, for notebook 04,
the capstone and the doctor alike; its thresholds live here, each with its source.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from .checks import check_choice, check_int, check_number
from .devices import as_device, synchronize
from .timing import Measurement, measurement

# The suite's one rule set for a loop's time (notebooks 03, 04 and 19, the doctor): each
# threshold below, and in THRESHOLDS with its source. Two are the TensorBoard profiler plugin's
# performance advisor's (the plugin is retired, its rules kept): "DataLoader time > 5 % of the
# step" -> more workers; "GPU utilisation < 50 %" -> a bigger batch (RunProfileData.analyze).
ADVISOR = (
    "https://github.com/pytorch/kineto/blob/0346c492c60257b37ba198613de64dfe5e574c96/"
    "tb_plugin/torch_tb_profiler/profiler/data.py"
)
INPUT_WAIT_SHARE = 0.05  # waiting for data at least this share of the step: input-bound
# The device busy at least DEVICE_BUSY of the step: device-bound, the device (not the host) is the
# limit. Busy time counts memory-bound kernels too: whether the kernels are limited by arithmetic
# or by memory takes their rates against the device's ceilings (the kernel view:
# https://docs.pytorch.org/docs/stable/profiler.html,
# https://docs.nvidia.com/deeplearning/performance/dl-performance-gpu-background/index.html).
DEVICE_BUSY = 0.50
# The host waiting for the device: a read (.item(), a data-dependent shape), or a copy to the
# device that waits (pageable memory, non_blocking=False).
SYNC_STALL_SHARE = 0.05
COPY_WAIT_SHARE = 0.05
# The ops a step dispatches times this machine's measured cost per op (the doctor measures both).
OVERHEAD_SHARE = 0.30
# A busy device's arithmetic rate over its measured ceiling (a large matmul's rate on this
# device, never above the datasheet's peak): near its ceiling from here.
NEAR_CEILING = 0.50


@dataclass(frozen=True)
class Threshold:
    """One line of `bottleneck`'s rule: a `share` of the step at or above `at` names `kind`."""

    share: str
    at: float
    kind: str
    words: str  # what the share is, in words
    source: str  # where `at` comes from


# In the order `bottleneck` reads them: the host's waits first (the largest one at or over its
# line names the loop; a tie goes to the first), then the device.
HOST_WAITS = (
    Threshold(
        "data_wait",
        INPUT_WAIT_SHARE,
        "input-bound",
        "waiting for data",
        f"the TensorBoard profiler advisor: DataLoader time > 5 % of the step ({ADVISOR})",
    ),
    Threshold(
        "copy",
        COPY_WAIT_SHARE,
        "copy-bound",
        "waiting for copies to the device",
        "the advisor's 5 % for the data wait, applied to the host's measured wait for copies",
    ),
    Threshold(
        "sync",
        SYNC_STALL_SHARE,
        "sync-bound",
        "waiting for the device (syncs)",
        "the advisor's 5 % for the data wait, applied to the host's measured wait for syncs",
    ),
    Threshold(
        "overhead",
        OVERHEAD_SHARE,
        "overhead-bound",
        "dispatching ops",
        "measured by the doctor on the 2-core CPU: notebook 20's 1024-wide MLP < 1 %, its 40 "
        "tiny Linear layers 95-130 %; from 30 %, a bigger batch or fusion saves the overhead",
    ),
)
BUSY = Threshold(
    "busy",
    DEVICE_BUSY,
    "device-bound",
    "device busy",
    f"the TensorBoard profiler advisor: GPU utilisation < 50 % -> a bigger batch ({ADVISOR})",
)
CEILING = Threshold(
    "rate",
    NEAR_CEILING,
    "device-bound, near its ceiling",
    "rate against its ceiling",
    "half: the best-tuned large training runs reach about that much of their chips' peak "
    "(PaLM 540B: 46.2 % model FLOPs utilisation, section 4.1 of https://arxiv.org/abs/2204.02311)",
)
THRESHOLDS = (*HOST_WAITS, BUSY, CEILING)
VERDICTS = (
    *(t.kind for t in HOST_WAITS),
    "device-bound",
    "device-bound, near its ceiling",
    "device-bound, below its ceiling",
    "inconclusive",
)
RULE = (
    "; ".join(f"{t.kind} if {t.words} >= {t.at:.0%}" for t in HOST_WAITS)
    + " (the largest such share names it); else device-bound if the device is busy >= "
    f"{DEVICE_BUSY:.0%} (near its ceiling from {NEAR_CEILING:.0%} of it, where the rate is "
    "known); else overhead-bound (an idle device, the data ready); inconclusive where what "
    "decides was not measured"
)


@dataclass(frozen=True)
class Verdict:
    """What bounds a loop: `kind` (one of VERDICTS), the shares it was given (None: not
    measured) and the rule that decided, with its thresholds, in words."""

    kind: str
    shares: dict[str, float | None]
    rule: str

    def __str__(self) -> str:
        return self.kind


def bottleneck(
    *,
    data_wait: float | None = None,
    copy: float | None = None,
    sync: float | None = None,
    overhead: float | None = None,
    busy: float | None = None,
    rate: float | None = None,
) -> Verdict:
    """The suite's one classifier of a loop, from its shares of the step's wall time (fractions;
    None: not measured): waiting for data, for copies to the device, for syncs; dispatching ops;
    the device busy; and `rate`, a busy device's arithmetic rate over its measured ceiling.

    A host wait at or above its threshold names the loop (the largest one); else a device busy
    at least DEVICE_BUSY is device-bound: busy time counts memory-bound kernels too, so busy
    alone never says compute-bound, only the rate says near or below the ceiling; else, the
    data wait measured, the idle device is the host's doing: overhead-bound. Else inconclusive.
    """
    shares = {
        "data_wait": data_wait,
        "copy": copy,
        "sync": sync,
        "overhead": overhead,
        "busy": busy,
        "rate": rate,
    }
    for name, value in shares.items():
        if value is None:
            continue
        is_rate = name == "rate"  # a rate may read above its ceiling (two timings, two moments)
        what = "a finite number >= 0 or None" if is_rate else "a share in [0, 1] or None"
        share = check_number(name, value, where="bottleneck", inclusive=True, what=what)
        if not is_rate and share > 1.0 + 1e-6:
            raise ValueError(f"bottleneck: {name} must be {what}, got {value!r}")
    over = [t for t in HOST_WAITS if shares[t.share] is not None and shares[t.share] >= t.at]
    if over:
        top = max(over, key=lambda t: shares[t.share])  # a tie: the first in HOST_WAITS
        rest = " (the largest wait at or over its line)" if len(over) > 1 else ""
        return Verdict(top.kind, shares, _line(top, shares[top.share]) + rest)
    if busy is not None and busy >= DEVICE_BUSY:
        rule = f"no wait at or over its line; {_line(BUSY, busy)}"
        if rate is None:
            return Verdict(
                "device-bound", shares, rule + "; its rate against its ceiling not measured"
            )
        near = "near" if rate >= NEAR_CEILING else "below"
        return Verdict(
            f"device-bound, {near} its ceiling", shares, f"{rule}; {_line(CEILING, rate)}"
        )
    if busy is not None and data_wait is not None:
        return Verdict(
            "overhead-bound",
            shares,
            f"{_line(BUSY, busy)} and {_line(HOST_WAITS[0], data_wait)}: the host (Python, "
            "dispatch, kernel launches) does not keep the device fed",
        )
    missing = "the device's busy share" if busy is None else "the data wait (an idle device)"
    return Verdict("inconclusive", shares, f"no wait at or over its line; not measured: {missing}")


def _line(t: Threshold, value: float) -> str:
    """A share against its threshold, in words: 'waiting for data 12.0% >= 5%'."""
    return f"{t.words} {value:.1%} {'>=' if value >= t.at else '<'} {t.at:.0%}"


def busy_fraction(busy_s: float, wall_s: float) -> float:
    """The device's busy share of a window: busy seconds over wall seconds, at most 1 (the
    profiler's spans and the host's clock are read apart: busy can read a little past the wall)."""
    check_number("busy_s", busy_s, where="busy_fraction", inclusive=True)
    check_number("wall_s", wall_s, where="busy_fraction")
    return min(busy_s / wall_s, 1.0)


def profiler_activities(device: str | torch.device) -> list[ProfilerActivity]:
    """What `torch.profiler.profile` records on `device`: the CPU side, plus the GPU's kernels
    and copies on CUDA (`ProfilerActivity.CUDA`) and on Intel GPUs (`ProfilerActivity.XPU`).
    `ProfilerActivity` has no MPS member: on an Apple GPU it records the CPU side only.
    https://docs.pytorch.org/docs/stable/profiler.html#torch.profiler.profile"""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as e:
        raise ValueError(
            f"profiler_activities: device must be a device such as 'cpu' or 'cuda', got {device!r}"
        ) from e
    gpu = {"cuda": ProfilerActivity.CUDA, "xpu": ProfilerActivity.XPU}.get(kind)
    return [ProfilerActivity.CPU] + ([gpu] if gpu is not None else [])


def wait_verdict(wait_fraction: float) -> tuple[str, str]:
    """(kind, sentence) for a share of step time spent waiting for data, where that is all that
    was measured (notebook 03): `bottleneck`'s input rule alone; kind is 'input-bound' (at least
    INPUT_WAIT_SHARE) or 'not input-bound'."""
    if (
        not isinstance(wait_fraction, int | float)
        or isinstance(wait_fraction, bool)
        or not 0.0 <= wait_fraction <= 1.0 + 1e-6
    ):
        raise ValueError(
            f"wait_verdict: wait_fraction must be a fraction in [0, 1], got {wait_fraction!r}"
        )
    pct = 100 * wait_fraction
    rule = f"(the rule: input-bound from {INPUT_WAIT_SHARE:.0%})"
    if bottleneck(data_wait=wait_fraction).kind == "input-bound":
        return "input-bound", (
            f"{pct:.0f} % of step time is waiting for data: input-bound {rule}. Add DataLoader "
            "workers, keep the data in memory as uint8, or move augmentation to the device; a "
            f"faster model saves at most the other {100 - pct:.0f} %."
        )
    return "not input-bound", (
        f"only {pct:.0f} % of step time is waiting for data {rule}: the time is in the step, "
        "and faster input saves at most that much."
    )


class DataWaitMeter:
    """Wraps a batch source: the time in `next(batch)` vs the time in the step."""

    def __init__(
        self, iterable: Iterable, *, device: str | torch.device | None = None, sync_every: int = 1
    ) -> None:
        check_int("sync_every", sync_every, where="DataWaitMeter")
        if not isinstance(iterable, Iterable):
            raise TypeError(
                f"DataWaitMeter: iterable must be iterable (a DataLoader, a list of batches, ...), "
                f"got {type(iterable).__name__}"
            )
        self.iterable = iterable
        self.device = as_device(device, "DataWaitMeter: device") if device is not None else None
        self.sync_every = sync_every
        self.wait: list[float] = []
        self.compute: list[float] = []

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.iterable)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            t1 = time.perf_counter()
            self.wait.append(t1 - t0)
            yield batch
            if len(self.wait) % self.sync_every == 0:
                synchronize(self.device)
            self.compute.append(time.perf_counter() - t1)

    def summary(self, skip: int = 0) -> dict[str, float]:
        """Totals over the steps; `skip=k` leaves out the first k (a DataLoader's first `next()`
        also starts its workers: not a steady-state wait)."""
        check_int("skip", skip, 0, where="DataWaitMeter.summary")
        wait, compute = sum(self.wait[skip : len(self.compute)]), sum(self.compute[skip:])
        steps = max(0, len(self.compute) - skip)
        return {
            "steps": steps,
            "step_s": (wait + compute) / steps if steps else 0.0,
            "wait_s": wait,
            "compute_s": compute,
            "wait_fraction": wait / (wait + compute) if wait + compute else 0.0,
        }

    def timing(self, skip: int = 0) -> Measurement:
        """The steps after the first `skip` as one timed window (`summary`'s mean step), for a
        claim judged on it: its mean step, and the seconds of the whole window."""
        s = self.summary(skip)
        if not s["steps"]:
            raise ValueError(
                f"DataWaitMeter.timing: no step was timed after the first {skip}: run more steps"
            )
        return measurement(
            [s["step_s"]], "steps", window=s["wait_s"] + s["compute_s"], device=self.device
        )

    def diagnosis(self, skip: int = 0) -> str:
        """One sentence: is this loop input-bound? (`wait_verdict`)"""
        return wait_verdict(self.summary(skip)["wait_fraction"])[1]


# torch.utils.data labels each DataLoader `__next__` so that the profiler shows it.
LOADER_EVENT = "enumerate(DataLoader)"


def loader_wait_seconds(prof: profile) -> float | None:
    """Seconds the host spent in DataLoader `__next__` calls in `prof`'s window; None where no
    DataLoader ran in it. The data wait of a loop nobody can wrap in a DataWaitMeter: a script
    the doctor runs unmodified, the loops notebook 19 hooks a StepWindow into."""
    spans = [
        e.time_range.elapsed_us()
        for e in prof.events()
        if e.name.startswith(LOADER_EVENT) and "__next__" in e.name
    ]
    return sum(spans) / 1e6 if spans else None


def busy_seconds(prof: profile, device_type: str) -> float:
    """How long the device was busy in `prof`'s window: the suite's one busy formula (notebook
    04, the capstone and the doctor read it). On a GPU, the time covered by at least one kernel
    or copy, so kernels overlapping on two streams count once, averaged over the GPUs that ran
    any; on a CPU, the operators' self time. Labels (`record_function`) are not work."""
    check_choice("device_type", device_type, ("cpu", "cuda", "mps", "xpu"), where="busy_seconds")
    if device_type != "cuda":
        return (
            sum(e.self_cpu_time_total for e in prof.key_averages() if not e.is_user_annotation)
            / 1e6
        )
    spans: dict[int, list[tuple[float, float]]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.is_user_annotation:
            spans.setdefault(e.device_index, []).append((e.time_range.start, e.time_range.end))
    covered = [covered_us(intervals) for intervals in spans.values()]
    return sum(covered) / len(covered) / 1e6 if covered else 0.0


def covered_us(spans: list[tuple[float, float]]) -> float:
    """Microseconds covered by at least one of the (start, end) spans: overlaps count once."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(spans):
        if hi < lo:  # a reversed span would be counted as nothing, silently
            raise ValueError(f"covered_us: spans must end after they start, got ({lo}, {hi})")
        total += max(0.0, hi - max(lo, end))
        end = max(end, hi)
    return total


class StepWindow:
    """Profile steps `warmup+1 ... warmup+steps` of a loop that calls `w(k)` after its k-th step:
    `torch.profiler.schedule` (notebook 04) with `warmup-1` steps unprofiled (worker start-up,
    lazy initialisation, compiling, CUDA-graph recording), one profiler warm-up step (the
    profiler's own start-up) and `steps` recorded. Make it just before the loop: the profiler
    counts steps from then on. The device is synchronised at both edges of the recorded steps.
    Call `finish()` after the loop (also after an error): it closes a window the loop ended
    early (`steps_done`: how many steps were recorded).
    """

    def __init__(
        self, *, device: str | torch.device | None = None, warmup: int = 3, steps: int = 10
    ) -> None:
        check_int("warmup", warmup, where="StepWindow")
        check_int("steps", steps, where="StepWindow")
        self.device = as_device(device)
        self.warmup = warmup
        self.stop_after = warmup + steps  # the steps the loop needs for all of it
        self.t0 = self.wall = 0.0
        self.steps_done, self.recorded = 0, False
        self.prof = profile(
            activities=profiler_activities(self.device),
            schedule=schedule(wait=warmup - 1, warmup=1, active=steps, repeat=1),
            on_trace_ready=self._ready,
        )
        self.prof.start()
        self._open = True

    def _ready(self, prof: profile) -> None:
        self.recorded = True

    def __call__(self, step: int) -> None:
        if not self._open:
            return
        if self.warmup < step <= self.stop_after:
            self.steps_done = step - self.warmup
        if step == self.warmup:  # the recorded steps start now
            synchronize(self.device)
            self.prof.step()
            self.t0 = time.perf_counter()
        elif step == self.stop_after:
            self.finish()
        else:
            self.prof.step()

    def finish(self) -> StepWindow:
        if self._open:
            synchronize(self.device)
            if self.steps_done:
                self.wall = time.perf_counter() - self.t0
            self.prof.stop()  # the trace is ready if any step was recorded
            self._open = False
        return self

    @property
    def busy_fraction(self) -> float | None:
        """Kernel time (GPU) or operator self time (CPU) over the recorded steps' wall time
        (`busy_seconds`); None when the loop never reached them, or where kernel time is not
        read (MPS records none; XPU records its kernels, this reads CUDA's only)."""
        if not self.recorded or not self.wall or self.device.type not in ("cpu", "cuda"):
            return None
        return busy_fraction(busy_seconds(self.prof, self.device.type), self.wall)

    @property
    def wait_fraction(self) -> float | None:
        """Time in DataLoader `__next__` over the recorded steps' wall time
        (`loader_wait_seconds`); None when the loop never reached them or drew no batch from a
        DataLoader in them (batches from tensors are gathered inside the step)."""
        wait = loader_wait_seconds(self.prof) if self.recorded and self.wall else None
        return None if wait is None else min(wait / self.wall, 1.0)

    def count(self, prefix: str) -> int:
        """How many events whose name starts with `prefix` ran in the window (e.g.
        'cudaGraphLaunch': CUDA graphs replayed; 0: the steps ran kernel by kernel)."""
        if not self.recorded:
            return 0
        return sum(e.count for e in self.prof.key_averages() if e.key.startswith(prefix))
