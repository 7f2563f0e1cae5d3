"""Copies between host and device, told apart (CUDA): from the profiled window's events, how
long a step spends copying to and from the device, split by direction, by the host memory's
kind (pinned or pageable) and by whether the host waited for the copy (blocking or not).

A pure function of event records (`account`), so a recorded trace tests it without a GPU
(tests/doctor_traces/). `records` makes them from torch.profiler's events.

The names, from the sources that make them (not guessed):
- the device's copies: Kineto names each CUPTI memcpy record "Memcpy <kind> (<src> -> <dst>)"
  (pytorch/kineto libkineto/src/CuptiActivity.cpp, `memcpyName`), with the kinds "HtoD",
  "DtoH", ... and the memories "Pageable", "Pinned", "Device", ... of
  libkineto/src/cupti_strings.cpp (`memcpyKindString`, `memoryKindString`): "Memcpy HtoD
  (Pageable -> Device)", "Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pageable)";
  torch.profiler gives them device type CUDA.
- the host's calls: the CUDA runtime's names as Kineto lists them (cupti_strings.cpp,
  `runtimeCbidNames`: "cudaMemcpy", "cudaMemcpyAsync", "cudaStreamSynchronize", ...), device
  type CPU. PyTorch copies between host and device with `cudaMemcpyAsync`; a blocking copy
  (non_blocking=False) is `c10::cuda::memcpy_and_sync`, `cudaMemcpyAsync` then
  `cudaStreamSynchronize` (pytorch c10/cuda/CUDAFunctions.h), a non-blocking one the
  `cudaMemcpyAsync` alone (aten/src/ATen/native/cuda/Copy.cu, `copy_kernel_cuda`). From
  pageable memory the runtime stages the copy, so even a non-blocking one holds the host.
- which host call a copy belongs to: torch.profiler links both the device's record and the
  runtime call to the operator that issued them (FunctionEvent.linked_correlation_id, the
  operator's correlation id: torch/autograd/profiler.py, `_parse_kineto_results`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from .. import diagnose

# "Memcpy HtoD (Pageable -> Device)": the direction, the source's memory, the destination's.
MEMCPY = re.compile(r"^Memcpy (HtoD|DtoH) \(([\w ]+) -> ([\w ]+)\)$")
# Runtime calls in which the host waits for the device: a copy's own call, or the sync after it.
WAITS = {
    "cudaMemcpy",
    "cudaMemcpyAsync",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
}
# Clocks: Kineto puts the device's timestamps on the host's clock to the microsecond (it
# truncates nanoseconds to microseconds: CuptiActivity.cpp, `us`).
CLOCK_US = 1.0


@dataclass(frozen=True)
class Event:
    """One profiler event: `device` "CPU" (a host call or operator) or "CUDA" (a kernel or a
    copy on the device); `thread`: the host thread, or a device event's stream; `op`: the
    operator it belongs to (0: not known)."""

    name: str
    device: str
    start_us: float
    dur_us: float
    thread: int = 0
    op: int = 0

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


def records(events: Iterable[object]) -> list[Event]:
    """`Event`s from torch.profiler's events (`prof.events()`): the device's copies and kernels,
    and the host's waiting calls (the only ones `account` reads)."""
    out = []
    for e in events:
        device = "CUDA" if str(e.device_type).endswith("CUDA") else "CPU"
        if device == "CPU" and e.name not in WAITS:
            continue
        out.append(
            Event(
                e.name,
                device,
                e.time_range.start,
                e.time_range.elapsed_us(),
                e.device_resource_id if device == "CUDA" else e.thread,
                getattr(e, "linked_correlation_id", 0) or 0,
            )
        )
    return out


@dataclass
class Kind:
    """The copies of one kind, per step: how many, their time on the device (the transfer), and
    the time the host was held in their calls (the copy's own and the sync after it)."""

    direction: str  # "host->device" or "device->host"
    memory: str  # the host side's: "pageable", "pinned" (or what Kineto called it)
    blocking: bool  # the host waited until the transfer ended
    per_step: float = 0.0
    transfer_s: float = 0.0
    held_s: float = 0.0


def account(events: list[Event], steps: int, window_s: float) -> dict:
    """The profiled window's copies between host and device (`steps` steps in `window_s`
    seconds), per step: {"kinds": [Kind as a dict], "exposed_s", "transfer_s", "held_s" (seconds
    a step), "step_s" (the window's step), "share" (exposed_s over it)}.

    `exposed_s` is what the copies cost the step: the time with a copy on the device and no
    kernel computing beside it, together with the time the host was held by a copy to the
    device. A copy overlapped by compute on another stream costs nothing; one that holds the
    host costs its whole wait, as the host cannot queue the next kernels meanwhile. The host's
    waits for copies *from* the device (`.item()`, `.cpu()`) are the sync rule's: reading less
    often removes them, and the device's time is the kernels' it waited for; their transfer
    counts here."""
    copies, kernels, waits = [], [], []
    for e in events:
        if e.device == "CUDA":
            (copies if MEMCPY.match(e.name) else kernels).append(e)
        elif e.name in WAITS:
            waits.append(e)
    kinds: dict[tuple, Kind] = {}
    transfers, held = [], []
    for c in copies:
        kind, src, dst = MEMCPY.match(c.name).groups()
        upload = kind == "HtoD"
        host = (src if upload else dst).lower()
        wait = _wait(c, waits)
        k = kinds.setdefault(
            (upload, host, wait is not None),
            Kind("host->device" if upload else "device->host", host, wait is not None),
        )
        k.per_step += 1
        k.transfer_s += c.dur_us
        transfers.append((c.start_us, c.end_us))
        if wait is not None:
            k.held_s += wait[1] - wait[0]
            if upload:
                held.append(wait)
    busy = [(k.start_us, k.end_us) for k in kernels]
    exposed = diagnose.covered_us(held + _minus(transfers, busy))
    for k in kinds.values():
        k.per_step /= steps
        k.transfer_s *= 1e-6 / steps
        k.held_s *= 1e-6 / steps
    # costliest first: a read's wait is mostly the kernels' before it, so only its transfer
    order = sorted(
        kinds.values(),
        key=lambda k: -(k.transfer_s + k.held_s * (k.direction == "host->device")),
    )
    step_s = window_s / steps
    return {
        "kinds": [asdict(k) for k in order],
        "exposed_s": 1e-6 * exposed / steps,
        "transfer_s": 1e-6 * diagnose.covered_us(transfers) / steps,
        "held_s": 1e-6 * diagnose.covered_us(held) / steps,
        "step_s": step_s,
        "share": min(1.0, 1e-6 * exposed / window_s) if window_s > 0 else 0.0,
    }


def _wait(copy: Event, waits: list[Event]) -> tuple[float, float] | None:
    """The span the host was held for `copy` (from its call's start to the end of the last call
    still running when the transfer ended), or None: the host went on before the transfer
    ended (a non-blocking copy). The calls are those of the copy's own operator where the
    events say which, else those running when the transfer ended."""
    mine = [w for w in waits if copy.op and w.op == copy.op] or [
        w for w in waits if w.start_us <= copy.end_us <= w.end_us + CLOCK_US
    ]
    if not mine or max(w.end_us for w in mine) + CLOCK_US < copy.end_us:
        return None
    return min(w.start_us for w in mine), max(w.end_us for w in mine)


def _minus(spans: list[tuple[float, float]], cover: list[tuple[float, float]]):
    """The parts of `spans` that no span of `cover` overlaps."""
    merged: list[list[float]] = []
    for a, b in sorted(cover):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    out = []
    for a, b in spans:
        for lo, hi in merged:
            if hi <= a or lo >= b:
                continue
            if lo > a:
                out.append((a, lo))
            a = max(a, hi)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out
