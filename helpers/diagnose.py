"""Profile a window of steady steps inside a running training loop (notebook 12's capstone).

Notebook 11 writes the profiler set-up itself (schedule, labelled phases, the bound-by rule);
this is the same measurement as a per-step hook, for the loops notebook 12 writes in its cells
(`capstone.measure` calls them with `on_step=w`).
"""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

from .checks import check_int
from .devices import as_device, synchronize

# torch.profiler times kernels on CUDA only; on other accelerators (Apple's MPS, Intel's XPU)
# the device's busy time is not measured, and `busy_fraction` says None instead of guessing.
KERNEL_TIMED = ("cuda",)


def _busy_seconds(prof: profile, device_type: str) -> float:
    """GPU kernel (and copy) time, averaged over the GPUs that ran anything; on a CPU the
    operators' self time. Labels (`record_function`, DataLoader's, the optimizer's) are not work,
    and on a GPU only kernel rows count: a CPU operator also carries its kernels' time."""
    if device_type != "cuda":
        return sum(e.self_cpu_time_total for e in prof.key_averages() if not e.is_user_annotation) / 1e6
    per_gpu: dict[int, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.is_user_annotation:
            per_gpu[e.device_index] = per_gpu.get(e.device_index, 0.0) + e.self_device_time_total
    return sum(per_gpu.values()) / len(per_gpu) / 1e6 if per_gpu else 0.0


class StepWindow:
    """Profile steps `warmup+1 ... warmup+steps` of a loop that calls `w(k)` after its k-th step.

    The first `warmup` steps run unprofiled (worker start-up, lazy initialisation, recompiles,
    CUDA-graph recording); the device is synchronised at both edges of the window. Call
    `finish()` after the loop (it also closes a window the loop ended early; `steps_done` says
    how many steps were profiled).
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
        """Kernel time (GPU) or operator self time (CPU) over the window's wall time; None when
        the loop never reached the window, or where torch.profiler does not time kernels."""
        if self.prof is None or self._running or not self.wall:
            return None
        if self.device.type not in ("cpu", *KERNEL_TIMED):
            return None
        return min(_busy_seconds(self.prof, self.device.type) / self.wall, 1.0)

    def count(self, prefix: str) -> int:
        """How many events whose name starts with `prefix` ran in the window (e.g.
        'cudaGraphLaunch': CUDA graphs were replayed; 0 means the steps ran kernel by kernel)."""
        if self.prof is None:
            return 0
        return sum(e.count for e in self.prof.key_averages() if e.key.startswith(prefix))
