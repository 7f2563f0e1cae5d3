"""Reading the windows: the profiler's events, the counter's counts, the machine's own rates,
and what this device could not show."""

from __future__ import annotations

import itertools
import statistics
import time
from collections import Counter

import psutil
import torch
import torch.utils.benchmark as tb

from .. import devices, diagnose
from . import copies
from .counting import OpCounter
from .rules import Measured

# CUDA runtime calls in which the host waits for the device.
STALL_EVENTS = {
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpyAsync",
}
COPIES_UNSEEN = (
    "copies between host and device (pinned or pageable, blocking or not, and what they cost a "
    "step; on CUDA the profiler times each one): "
)
UNSEEN = {
    "cpu": [
        "syncs: counted, not costed (a CPU has no queue to drain; a GPU would pay for each); "
        ".cpu()/.tolist()/.numpy()/print(t) run no op on a CPU and are not counted",
        "device busy: a CPU is not a separate device that could idle",
        COPIES_UNSEEN + "a CPU's tensors are already in the memory it computes from",
    ],
    "mps": [
        "device busy and sync stalls: torch.profiler does not time MPS kernels",
        COPIES_UNSEEN + "torch.profiler does not time MPS copies",
        "memory peak: the process's resident memory, not the GPU's",
    ],
    "cuda": [],
}
# The profiler's label for each call of a torch.compile'd region (frame/compile ids after it).
COMPILED_EVENT = "Torch-Compiled Region"
# Collectives, by the names torch.profiler gives them on torch 2.14 (seen in a 2-rank gloo DDP
# run, rank 1 slowed by 50 ms a step: rank 0's "gloo:all_reduce" spans lasted 48 ms a step,
# rank 1's 5 ms): gloo's work items "gloo:all_reduce", "gloo:broadcast", "gloo:barrier", ...,
# each on a gloo thread from its enqueue to its completion, so the time a peer keeps it waiting
# is inside; DDP's buckets overlap, hence their union, not their sum. NCCL's, from torch's
# source (one GPU here: not run): "nccl:<op>" on the host (the enqueue) and its kernels
# (ncclDevKernel_*, ncclKernel_*), which spin on the device until every peer arrives. Not counted:
# "c10d::allreduce_" and its kin, the dispatcher op that only enqueues (0.1 ms, at the span's
# start), and DDP's reducer events (bucket copies: compute, not waiting).
COLLECTIVES = ("gloo:", "nccl:", "nccldevkernel", "ncclkernel")


def read(session: object, m: Measured) -> None:
    """Fill `m` from the session's profiled and counted windows and this machine's rates."""
    prof_w, count_w = session.named("profiled"), session.named("counted")
    if prof_w is not None and session.prof is not None:
        _from_profiler(session.prof, prof_w, m, session.opt)
    else:
        m.not_measured.append("the profiled window (data wait, device busy, sync stalls)")
    if count_w is not None and session.counter is not None:
        c, n = session.counter, count_w.steps
        m.syncs_per_step = sum(c.syncs.values()) / n
        m.sync_ops = {k: v // n or 1 for k, v in c.syncs.items()}
        m.sync_sites = [
            {"where": where, "library": lib, "per_step": v / n}
            for (where, lib), v in c.sites.most_common()
        ]
        m.ops_per_step = c.ops / n
        m.flops_per_step = session.flops.get_total_flops() / n
        m.hot_ops = [{"op": k, "per_step": v / n} for k, v in c.hot.most_common(4)]
    else:
        m.not_measured.append("the counted window (syncs, ops, FLOPs)")
    m.unseen += UNSEEN.get(m.device, [])
    _memory(session, m)
    dtype = hot_dtype(session.counter.hot) if session.counter is not None else torch.float32
    m.matmul_dtype = str(dtype).removeprefix("torch.")
    if session.rates is None:  # measured once per session, in the hot ops' dtype
        session.rates = machine_rates(session.device, dtype)
    m.dispatch_s, m.matmul_flops_per_s = session.rates


def _from_profiler(
    prof: torch.profiler.profile, w: object, m: Measured, opt: torch.optim.Optimizer | None
) -> None:
    window_s = w.t1 - w.t0
    stall = 0.0
    compiled = 0
    collectives = []  # (start, end) in us, host spans and device kernels alike
    step_event = f"Optimizer.step#{type(opt).__name__}.step"  # the optimizer's own label
    ends, first, last = [], float("inf"), float("-inf")  # its steps' ends, its first and last
    for e in prof.events():
        first, last = min(first, e.time_range.start), max(last, e.time_range.end)
        if e.name.lower().startswith(COLLECTIVES):
            collectives.append((e.time_range.start, e.time_range.end))
        elif e.name == step_event:
            ends.append(e.time_range.end)
        if str(e.device_type).endswith("CUDA"):  # a kernel: the busy formula reads those
            continue
        if e.name.startswith(COMPILED_EVENT):
            compiled += 1
        elif e.name in STALL_EVENTS:
            stall += e.time_range.elapsed_us()
    if compiled:
        m.unseen.append(
            f"inside compiled graphs (torch.compile'd regions per step: {compiled / w.steps:.3g}): "
            "Inductor's fused kernels do not pass the dispatcher, so the ops, FLOPs and "
            "syncs counted there are only the library calls the graph makes (matmuls, "
            "convolutions); the step's time is measured as it runs"
        )
    if m.wait_s is None and window_s > 0:  # the CLI: no loader in hand, the profiler's events
        # the share of the profiled window spent waiting, applied to the timed step: the two
        # windows' steps differ (the profiler's own cost, a slow first batch of an epoch), and
        # a wait from one over a step from the other could exceed the step
        wait = diagnose.loader_wait_seconds(prof) or 0.0  # no DataLoader: batches in hand
        m.wait_s = min(1.0, wait / window_s) * m.step_s
    if collectives or _in_process_group():
        # a step's edges: the ends of the optimizer's step events (the last one ends with the
        # window); without one per step (two optimizers of one class), the window as one step
        bounds = [first, *sorted(ends)] if len(ends) == w.steps else [first, last]
        _collectives(collectives, bounds, m)
    if m.device == "cuda":
        busy_s = diagnose.busy_seconds(prof, "cuda")
        m.busy = diagnose.busy_fraction(busy_s, window_s) if window_s > 0 else None
        m.stall_s = 1e-6 * stall / w.steps
        m.copies = copies.account(copies.records(prof.events()), w.steps, window_s)
        m.tensor_cores_idle = (
            devices.capabilities("cuda").ok("tf32")  # TF32 tensor cores: 8.0+
            and _matmul_fp32_precision() == "ieee"
        )


def _collectives(spans: list[tuple[float, float]], bounds: list[float], m: Measured) -> None:
    """Each profiled step's share with a collective in flight (`bounds`: the steps' edges, us),
    applied to the timed step as the data wait is: their median (one step a busy machine held
    up does not move it) and their spread."""
    from .session import spread

    shares = [
        min(
            1.0,
            diagnose.covered_us([(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi])
            / d,
        )
        for lo, hi in itertools.pairwise(bounds)
        if (d := hi - lo) > 0
    ] or [0.0]
    m.collective_s = statistics.median(shares) * m.step_s
    m.collective_spread_s = spread(shares) * m.step_s


def _in_process_group() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()


def _matmul_fp32_precision() -> str:
    """cuBLAS's fp32 setting through the fp32_precision API (the legacy getter raises once a
    script set the new one, as notebook 11 teaches); 'none' inherits the global setting."""
    for setting in (torch.backends.cuda.matmul.fp32_precision, torch.backends.fp32_precision):
        if setting != "none":
            return setting
    return "ieee"  # neither set: PyTorch's default, full fp32


def _memory(session: object, m: Measured) -> None:
    m.memory_peak = session.mem_peak or None
    if m.device == "cuda":
        m.memory_total = float(torch.cuda.get_device_properties(session.device).total_memory)
    else:
        m.memory_total = float(psutil.virtual_memory().total)


# A measurement of the machine's rates is reused for this long by later sessions in the same
# process (a notebook watches one loop after another: about 1 s each, with the same answer, as
# the rates are the best block, what the machine reaches, not its load of the moment).
RATES_FRESH_S = 60.0
_rates: dict[str, tuple[float, tuple[float, float]]] = {}  # "device dtype" -> (when, rates)


def machine_rates(
    device: torch.device | None, dtype: torch.dtype = torch.float32
) -> tuple[float, float]:
    """`measure_rates(device, dtype)`, or the same measurement of the last RATES_FRESH_S."""
    key = f"{device or 'cpu'} {dtype}"
    when, rates = _rates.get(key, (float("-inf"), None))
    if rates is None or time.monotonic() - when > RATES_FRESH_S:
        rates = measure_rates(device, dtype)
        _rates[key] = (time.monotonic(), rates)
    return rates


def hot_dtype(hot: dict[str, int]) -> torch.dtype:
    """The dtype most of the step's matmuls and convolutions ran in (the counted window's hot
    ops, "op dtype layout"): the ceiling is measured in it, so a bf16 loop is held to the bf16
    rate, not fp32's (TF32 comes with the process's fp32 setting, as the loop's does)."""
    by_dtype: Counter[str] = Counter()
    for key, n in hot.items():
        by_dtype[(key.split() + [""])[1]] += n
    dtype = getattr(torch, max(by_dtype, key=by_dtype.get, default="float32"), None)
    return dtype if dtype in (torch.float32, torch.bfloat16, torch.float16) else torch.float32


def measure_rates(
    device: torch.device | None, dtype: torch.dtype = torch.float32
) -> tuple[float, float]:
    """(seconds per op of a step made of tiny ops, FLOP/s of a matmul in `dtype`), measured on
    `device` now, each the best block: the rate this machine reaches, not its noise.

    The per-op cost is that of a reference training step (forward and backward through a chain
    of tiny Linear layers: all overhead, no work), over the ops it dispatches: autograd's
    bookkeeping and a step's working set included, which a bare `x.add_(1)` in a hot loop
    leaves out (it measured 0.4-0.7x of this here, and under a busy neighbour's cache pressure
    the step's ops slow while the bare op does not)."""
    device = device or torch.device("cpu")
    per_op = _tiny_op_step(device)
    n = 512 if device.type == "cpu" else 4096
    a = torch.randn(n, n, device=device, dtype=dtype)
    mm = min(tb.Timer("a @ a", globals={"a": a}).blocked_autorange(min_run_time=0.1).times)
    return per_op, 2 * n**3 / mm


def _tiny_op_step(device: torch.device, depth: int = 20, width: int = 16) -> float:
    """Seconds per dispatched op of forward + backward through `depth` tiny Linear layers."""
    layers = [m for _ in range(depth) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    net = torch.nn.Sequential(*layers).to(device)
    x = torch.randn(4, width, device=device)

    def step() -> None:
        net(x).sum().backward()
        if device.type != "cpu":
            devices.synchronize(device)

    step()  # the autograd graph's first build, and the .grad tensors, outside the timing
    with OpCounter(device) as counter:
        step()
    t = tb.Timer("step()", globals={"step": step}).blocked_autorange(min_run_time=0.05)
    return min(t.times) / counter.ops
