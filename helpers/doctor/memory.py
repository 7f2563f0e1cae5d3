"""Memory over time: does the loop keep something every step?

The peak says whether a step fits; growth says whether the run will. A loop that keeps each
step's features for a later metric without `.detach()` keeps their autograd graph too, and
runs out of memory hours in. The memory window (after the what-ifs, the loop as it is) samples
the memory held at each step boundary: the allocator's count where the device keeps one
(CUDA), else the live bytes of tensors made since the window opened (training.PeakTensorBytes'
weak references by storage: a CPU's resident memory is too noisy for a per-step slope). Its
dispatch mode also notes, for each tensor made, the script line that made it, so that the
tensors that survive the window can be blamed on a line.
"""

from __future__ import annotations

import math
import weakref

import torch

from .. import devices
from ..training import PeakTensorBytes
from .counting import sync_site

# Steps the memory window samples: the least-squares slope of 8 points is the fewest that
# tells a steady growth from a step-to-step wobble (the slope's error shrinks as n^-1.5).
MEMORY_STEPS = 8
# The growth worth a finding, in bytes per step. Keeping each step's loss on the device to read
# it every k steps (notebook 08's advice) keeps a 4-byte tensor a step (512 bytes in CUDA's
# allocator, which rounds to 512-byte blocks); predictions kept for an epoch's metric a few KiB.
# Those are by design and far below. At 64 KiB a step, 16,384 steps (a few epochs) keep 1 GiB.
GROWTH_FLOOR = 64 * 2**10
# The slope must also stand out of the samples' own scatter: at least 3 standard errors of the
# slope (residual spread / sqrt(sum of squared step offsets)), so a wobble is no trend.
SIGNIFICANCE = 3.0
MEMORY = "memory"  # the window's name


class LiveBytes(PeakTensorBytes):
    """PeakTensorBytes that also says what is alive now (not at its last op) and which line of
    the user's code made each storage, in which step."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0
        self._made: dict[int, tuple[weakref.ref, str, int]] = {}  # data_ptr -> (ref, line, step)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # torch's protocol
        out = super().__torch_dispatch__(func, types, args, kwargs)
        for ptr, (ref, _) in self._live.items():
            made = self._made.get(ptr)
            if made is None or made[0] is not ref:  # new since the last op: who made it
                self._made[ptr] = (ref, sync_site()[0], self.step)
        return out

    def live_bytes(self) -> int:
        """Bytes of storages made inside the mode and alive now."""
        return sum(n for ref, n in self._live.values() if ref() is not None)

    def survivors(self) -> list[dict]:
        """The lines whose storages, made before the last step, are still alive: by how many
        steps' storages survive (a steady leak: nearly all), then bytes."""
        by: dict[str, list] = {}
        for ptr, (ref, n) in self._live.items():
            made = self._made.get(ptr)
            if ref() is None or made is None or made[0] is not ref or made[2] >= self.step - 1:
                continue
            site = by.setdefault(made[1], [0, set()])
            site[0] += n
            site[1].add(made[2])
        ranked = sorted(by.items(), key=lambda kv: (-len(kv[1][1]), -kv[1][0]))
        return [{"where": w, "bytes": b, "steps": len(s)} for w, (b, s) in ranked[:3]]


def trend(samples: list[float]) -> tuple[float, float, float]:
    """(least-squares slope per step, residual spread, the slope's standard error)."""
    n = len(samples)
    xm, ym = (n - 1) / 2, sum(samples) / n
    sxx = sum((x - xm) ** 2 for x in range(n))
    slope = sum((x - xm) * (y - ym) for x, y in enumerate(samples)) / sxx
    resid = [y - (ym + slope * (x - xm)) for x, y in enumerate(samples)]
    spread = math.sqrt(sum(r * r for r in resid) / (n - 2)) if n > 2 else 0.0
    return slope, spread, spread / math.sqrt(sxx)


def growing(slope: float, error: float) -> bool:
    """A growth worth a finding: above the floor and out of the samples' scatter."""
    return slope >= GROWTH_FLOOR and slope > SIGNIFICANCE * error


class Sampler:
    """The memory window's instrument: entered when the window opens, sampled at each of its
    steps' ends, exited when it closes."""

    def __init__(self, device: torch.device | None) -> None:
        self.device = device or torch.device("cpu")
        self.counter = devices.has_peak_memory_counter(self.device)
        self.mode = LiveBytes()
        self.samples: list[float] = []
        self.sites: list[dict] = []

    @property
    def source(self) -> str:
        if self.counter:
            return f"{self.device.type} memory_allocated at each step's end"
        return "live bytes of tensors made in the window at each step's end (dispatch-mode count)"

    def enter(self) -> None:
        self.mode.__enter__()

    def sample(self) -> None:
        if self.counter:
            self.samples.append(float(devices.memory_allocated(self.device)))
        else:
            self.samples.append(float(self.mode.live_bytes()))
        self.mode.step += 1

    def exit(self) -> None:
        self.sites = self.mode.survivors()
        self.mode.__exit__(None, None, None)


def read(session: object, m: object) -> None:
    """Fill `m`'s memory-over-time fields from the session's memory window."""
    w, sampler = session.named(MEMORY), getattr(session, "memory", None)
    if not session.memory_steps:
        m.unseen.append(
            "memory over time: not watched (the steps the doctor was given leave no room for "
            f"its {MEMORY_STEPS}-step window; the command line: --steps 20 or more)"
        )
        return
    if w is None or sampler is None or len(sampler.samples) < 3:
        m.unseen.append(
            f"memory over time: the loop ended before the memory window's {MEMORY_STEPS} steps"
        )
        return
    m.memory_samples = list(sampler.samples)
    m.memory_slope, m.memory_spread, m.memory_slope_error = trend(sampler.samples)
    m.memory_source = sampler.source
    m.memory_sites = sampler.sites
