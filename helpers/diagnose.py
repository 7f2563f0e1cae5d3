"""Profile a few training steps and say, in words, what bounds the loop (claim L21).

    diag = diagnose.profile_loop(step, loader, device=device, steps=5)
    print(diag.message)   # "68 % of step time is waiting for data: ... input-bound ..."
    print(diag.table)     # torch.profiler's operator table, sorted by self time

Two measurements are combined:
- `helpers.data_wait.DataWaitMeter`: per step, time spent in `next(batch)` (waiting for data)
  vs time in the step itself (device synchronised, so queued GPU work counts as step time);
- `torch.profiler`: on a GPU, the kernels' total time over the wall time (how busy the device
  was); on a CPU, the time spent inside operators over the step time (how much of the step is
  arithmetic rather than Python).

The verdict, in order: at least `data_wait.INPUT_BOUND` of the time waiting for data ->
input-bound (I/O or CPU preprocessing; `data_wait.wait_verdict`, the one rule). Otherwise on a
GPU: device busy at least `busy_threshold` -> GPU-bound, else the GPU idles while Python
launches kernels -> CPU (launch-overhead) bound. On a CPU: operators take at least
`busy_threshold` of the step -> compute-bound on the CPU, else Python-overhead bound. On MPS or
XPU, whose kernels torch.profiler does not time, only "not input-bound" can be said, and is.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from .checks import check_choice, check_int
from .data_wait import DataWaitMeter, wait_verdict
from .devices import as_device, synchronize

KINDS = ("input-bound", "gpu-bound", "launch-bound", "cpu-compute-bound", "python-bound",
         "not-input-bound")
# torch.profiler times kernels on CUDA only; on other accelerators (Apple's MPS, Intel's XPU)
# the device's busy time is not measured here, and the verdict says so instead of guessing.
KERNEL_TIMED = ("cuda",)
STEP_LABEL = "train_step"


@dataclass
class Diagnosis:
    """What `profile_loop` found. `kind` is one of `KINDS`; `message` says it in words."""

    kind: str
    message: str
    device_type: str
    steps: int
    wall_s: float
    wait_fraction: float
    busy_fraction: float | None  # None where the device's kernel time is not measured
    table: str = ""
    trace_path: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "device_type": self.device_type,
                "steps": self.steps, "wall_s": self.wall_s, "wait_fraction": self.wait_fraction,
                "busy_fraction": self.busy_fraction,
                "trace_path": str(self.trace_path) if self.trace_path else None}


def classify(wait_fraction: float, busy_fraction: float | None, device_type: str, *,
             busy_threshold: float = 0.6) -> tuple[str, str]:
    """(kind, message) from the two fractions; a plain function so tests can check every branch.
    `busy_fraction` is None on an accelerator whose kernel time is not measured (MPS, XPU)."""
    check_choice("device_type", device_type, ("cpu", "cuda", "mps", "xpu"), where="classify")
    unmeasured = busy_fraction is None and device_type not in ("cpu", *KERNEL_TIMED)
    for name, v in (("wait_fraction", wait_fraction), ("busy_fraction", 0.0 if unmeasured else busy_fraction)):
        if not isinstance(v, int | float) or not 0.0 <= v <= 1.0 + 1e-6:
            raise ValueError(f"classify: {name} must be in [0, 1], got {v!r}")
    kind, sentence = wait_verdict(wait_fraction)
    if kind == "input-bound":
        return kind, sentence
    if unmeasured:  # only the data-wait rule can decide here, and it said "not input-bound"
        return "not-input-bound", (
            f"data waits are only {100 * wait_fraction:.0f} %: the loop is not input-bound. "
            f"torch.profiler does not time {device_type.upper()} kernels, so whether the device or "
            "Python and kernel launches set the pace is not measured here: time a step at twice the "
            "batch (device-bound steps take about twice as long, launch-bound ones do not)"
            + (", or trace it with torch.mps.profiler in Xcode Instruments." if device_type == "mps" else "."))
    wait, busy = 100 * wait_fraction, 100 * min(busy_fraction, 1.0)
    if device_type == "cuda":
        if busy_fraction >= busy_threshold:
            return "gpu-bound", (
                f"the GPU runs kernels {busy:.0f} % of the wall time and data waits are only "
                f"{wait:.0f} %: the loop is GPU-bound. Make the arithmetic cheaper: bf16 autocast, "
                "channels_last, torch.compile (fused kernels), or a faster GPU.")
        return "launch-bound", (
            f"the GPU is idle {100 - busy:.0f} % of the time although data waits are only "
            f"{wait:.0f} %: the loop is CPU-bound (Python and kernel-launch overhead). Use larger "
            "batches, torch.compile(mode='reduce-overhead') / CUDA graphs, and remove .item() syncs.")
    if busy_fraction >= busy_threshold:
        return "cpu-compute-bound", (
            f"{busy:.0f} % of step time is spent inside operators and only {wait:.0f} % waiting for "
            "data: the loop is compute-bound on the CPU. The model's arithmetic is the cost: fewer "
            "FLOPs or an accelerator are the levers, not the input pipeline.")
    return "python-bound", (
        f"only {busy:.0f} % of step time is spent inside operators (data waits {wait:.0f} %): the "
        "rest is Python overhead. Vectorise, use larger batches, or torch.compile.")


def _cpu_operator_fraction(prof: profile, wall_s: float | None = None) -> float:
    """Self time of the operators that ran inside the `train_step` ranges, over those ranges
    (or, with `wall_s`, of every operator the profiler saw, over that wall time)."""
    events = list(prof.events())
    if wall_s is not None:
        inside = sum(e.self_cpu_time_total for e in events
                     if e.device_type == torch.autograd.DeviceType.CPU
                     and not getattr(e, "is_user_annotation", False))
        return min(inside / 1e6 / wall_s, 1.0) if wall_s > 0 else 0.0
    ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == STEP_LABEL]
    total = sum(end - start for start, end in ranges)
    if not total:
        return 0.0
    inside = 0.0
    for e in events:
        if e.name == STEP_LABEL or getattr(e, "is_user_annotation", False):
            continue
        if e.device_type != torch.autograd.DeviceType.CPU:
            continue
        if any(s <= e.time_range.start < t for s, t in ranges):
            inside += e.self_cpu_time_total
    return min(inside / total, 1.0)


def _device_kernel_seconds(prof: profile) -> float:
    """Kernel (and copy) time on the GPU, averaged over the GPUs that ran anything.

    Only events whose device type is CUDA count: CPU operators also carry the time of the
    kernels they launched, so summing every row would count each kernel twice (the same rule
    as the profiler's own table footer).
    """
    per_device: dict[int, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
            per_device[e.device_index] = per_device.get(e.device_index, 0.0) + e.self_device_time_total
    if not per_device:
        return 0.0
    return sum(per_device.values()) / len(per_device) / 1e6


def profile_loop(step: Callable[..., Any], batches: Iterable, *, device: str | torch.device | None = None,
                 steps: int = 5, warmup: int = 1, trace_path: str | Path | None = None,
                 row_limit: int = 12, busy_threshold: float = 0.6) -> Diagnosis:
    """Run `warmup` then `steps` calls of `step(batch)` on batches from `batches`, profiled.

    `step` receives the batch exactly as the iterable yields it (for `(X, y)` batches write
    `lambda batch: train_step(*batch)`). The batches must be fresh: an exhausted iterator or a
    loader shorter than `warmup + steps` raises a clear error rather than a silent partial result.
    """
    for name, v, low in (("steps", steps, 1), ("warmup", warmup, 0), ("row_limit", row_limit, 1)):
        check_int(name, v, low, where="profile_loop")
    if not callable(step):
        raise TypeError(f"profile_loop: step must be callable, got {type(step).__name__}")
    dev = as_device(device)
    it = iter(batches)
    for _ in range(warmup):  # first batches pay for worker start-up, lazy init, autotuning
        try:
            step(next(it))
        except StopIteration:
            raise ValueError(f"profile_loop: batches ran out during the {warmup} warm-up step(s)") from None
    synchronize(dev)
    meter = DataWaitMeter(itertools.islice(it, steps), device=dev)
    activities = [ProfilerActivity.CPU]
    if dev.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=False) as prof:
        t0 = time.perf_counter()
        for batch in meter:
            with record_function(STEP_LABEL):
                step(batch)
        synchronize(dev)
        wall = time.perf_counter() - t0
    done = meter.summary()["steps"]
    if done < steps:
        raise ValueError(f"profile_loop: batches ran out after {done} of {steps} profiled steps; "
                         "give a longer loader or fewer steps")
    wait_fraction = meter.summary()["wait_fraction"]
    if dev.type == "cuda":
        busy = min(_device_kernel_seconds(prof) / wall, 1.0) if wall else 0.0
        sort_by = "self_cuda_time_total"
    else:
        busy = _cpu_operator_fraction(prof) if dev.type == "cpu" else None
        sort_by = "self_cpu_time_total"
    kind, message = classify(wait_fraction, busy, dev.type, busy_threshold=busy_threshold)
    table = prof.key_averages().table(sort_by=sort_by, row_limit=row_limit)
    path = None
    if trace_path is not None:
        path = Path(trace_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
    return Diagnosis(kind=kind, message=message, device_type=dev.type, steps=done, wall_s=wall,
                     wait_fraction=wait_fraction, busy_fraction=busy, table=table,
                     trace_path=path, extra={"meter": meter.summary()})


class StepWindow:
    """Profile a window of steps inside a running loop: steps `warmup+1 ... warmup+steps`.

    Pass it as the loop's per-step hook (`training.train(..., on_step=w)`,
    `capstone.train_reference(..., on_step=w)`); the loop calls `w(k)` after its k-th step. The
    first `warmup` steps run unprofiled, from the same iterator, so worker start-up, lazy
    initialisation, recompiles and CUDA-graph recording are not counted; the device is
    synchronised at both edges of the window. Call `finish()` after the loop (it also closes a
    window the loop ended early, and `steps_done` says how many steps were profiled).
    """

    def __init__(self, *, device: str | torch.device | None = None, warmup: int = 3, steps: int = 10) -> None:
        check_int("warmup", warmup, where="StepWindow")
        check_int("steps", steps, where="StepWindow")
        self.device = as_device(device)
        self.warmup, self.steps = warmup, steps
        self.prof: profile | None = None
        self.t0 = self.wall = 0.0
        self.steps_done = 0
        self._running = False

    def __call__(self, step: int) -> None:
        if step == self.warmup and self.prof is None:
            synchronize(self.device)
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
            self.prof = profile(activities=acts)
            self.prof.start()
            self._running = True
            self.t0 = time.perf_counter()
        elif self._running and step == self.warmup + self.steps:
            self._stop(step)

    def _stop(self, step: int) -> None:
        synchronize(self.device)
        self.wall = time.perf_counter() - self.t0
        self.prof.stop()
        self._running = False
        self.steps_done = step - self.warmup

    @property
    def stop_after(self) -> int:
        """How many steps the loop must run for the whole window (give the loop this limit)."""
        return self.warmup + self.steps

    def finish(self, steps_run: int | None = None) -> StepWindow:
        if self._running:
            self._stop(steps_run if steps_run is not None else self.warmup + self.steps)
        return self

    @property
    def busy_fraction(self) -> float | None:
        """Kernel time over wall time on a GPU, operator self time over wall time on a CPU;
        None when the loop never reached the window, or on a device whose kernels torch.profiler
        does not time (MPS, XPU)."""
        if self.prof is None or self._running or not self.wall:
            return None
        if self.device.type not in ("cpu", *KERNEL_TIMED):
            return None
        if self.device.type == "cuda":
            return min(_device_kernel_seconds(self.prof) / self.wall, 1.0)
        return _cpu_operator_fraction(self.prof, self.wall)

    def count(self, prefix: str) -> int:
        """How many events whose name starts with `prefix` ran in the window (e.g.
        'cudaGraphLaunch': CUDA graphs were replayed; 0 means the steps ran kernel by kernel)."""
        if self.prof is None:
            return 0
        return sum(e.count for e in self.prof.key_averages() if e.key.startswith(prefix))
