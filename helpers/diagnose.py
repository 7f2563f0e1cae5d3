"""Where does a running loop's time go? Waiting for data, and how busy the device is.

    meter = DataWaitMeter(loader, device=device)
    for X, y in meter:
        train_step(X, y)
    meter.summary(skip=1)   # {'wait_s', 'compute_s', 'wait_fraction', ...} past worker start-up
    meter.diagnosis()       # in words, by `wait_verdict`: the one input-bound rule

A step is timed up to the next `next()`, after a device sync, so queued GPU work is charged to
the step, not the data (`sync_every=k`: fewer stalls, the totals stay right). `StepWindow` is
notebook 17's profiler schedule as a per-step hook, for the loops notebook 18 writes in its cells.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from .checks import check_choice, check_int
from .devices import as_device, synchronize
from .timing import Measurement, measurement

# The suite's one rule set for a loop's time (notebooks 03 and 17, the capstone, the doctor),
# each threshold from the TensorBoard profiler plugin's performance advisor (the plugin is
# retired, its rules kept): "DataLoader time > 5 % of the step" -> more workers; "GPU
# utilisation < 50 %" -> a bigger batch (RunProfileData.analyze in
# https://github.com/pytorch/kineto/blob/0346c492c60257b37ba198613de64dfe5e574c96/tb_plugin/torch_tb_profiler/profiler/data.py).
INPUT_WAIT_SHARE = 0.05  # waiting for data at least this share of the step: input-bound
# The device busy at least DEVICE_BUSY of the step: device-bound, the device (not the host) is the
# limit. Busy time counts memory-bound kernels too: whether the kernels are limited by arithmetic
# or by memory takes their rates against the device's ceilings (the kernel view:
# https://docs.pytorch.org/docs/stable/profiler.html,
# https://docs.nvidia.com/deeplearning/performance/dl-performance-gpu-background/index.html).
DEVICE_BUSY = 0.50


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
    """(kind, sentence) for a share of step time spent waiting for data; kind is
    'input-bound' (at least INPUT_WAIT_SHARE) or 'not input-bound'."""
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
    if wait_fraction >= INPUT_WAIT_SHARE:
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


def busy_seconds(prof: profile, device_type: str) -> float:
    """How long the device was busy in `prof`'s window: the suite's one busy formula (notebook
    17, the capstone and the doctor read it). On a GPU, the time covered by at least one kernel
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
    covered = []
    for intervals in spans.values():
        total, end = 0.0, float("-inf")
        for lo, hi in sorted(intervals):
            total += max(0.0, hi - max(lo, end))
            end = max(end, hi)
        covered.append(total)
    return sum(covered) / len(covered) / 1e6 if covered else 0.0


class StepWindow:
    """Profile steps `warmup+1 ... warmup+steps` of a loop that calls `w(k)` after its k-th step:
    `torch.profiler.schedule` (notebook 17) with `warmup-1` steps unprofiled (worker start-up,
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
        return min(busy_seconds(self.prof, self.device.type) / self.wall, 1.0)

    def count(self, prefix: str) -> int:
        """How many events whose name starts with `prefix` ran in the window (e.g.
        'cudaGraphLaunch': CUDA graphs replayed; 0: the steps ran kernel by kernel)."""
        if not self.recorded:
            return 0
        return sum(e.count for e in self.prof.key_averages() if e.key.startswith(prefix))
