"""From measurements to findings: each rule names its threshold, the threshold's source, and
the numbers it compared. Pure functions of a `Measured`, so each is tested on both sides.

A finding's `share` is the fraction of step time it costs, where that was *measured*; None
where it was only counted (a CPU cannot show what a GPU would pay for a sync). Findings are
ranked by share, counted ones last. The loop's one verdict is `diagnose.bottleneck`'s, the
suite's classifier, on the shares measured here (`verdict`); its thresholds are shared too.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .. import diagnose

# The shares' thresholds, each with its source: the suite's one rule set (helpers.diagnose,
# `bottleneck`); busy is measured on CUDA (elsewhere: the step less its waits and dispatch).
from ..diagnose import (
    COPY_WAIT_SHARE,
    INPUT_WAIT_SHARE,
    OVERHEAD_SHARE,
    SYNC_STALL_SHARE,
)

# The --json report's schema: its version, and the JSON Schema shipped beside this module.
SCHEMA = "feed-the-gpu/doctor-report/5"
SCHEMA_FILE = Path(__file__).with_name("report.schema.json")

# The TensorBoard advisor's (helpers.diagnose): "peak memory > 90 %" -> smaller batch, activation
# checkpointing. A finding beside the verdict, not a verdict.
MEMORY_PEAK_SHARE = 0.90
# One read per step is what notebook 08 teaches to avoid (log every k steps instead).
SYNCS_PER_STEP = 1.0
# Copies between host and device (CUDA, from the profiler's events: copies.py): copy-bound when
# the step spends at least this share copying with nothing computing beside it, or with the host
# held by a copy to the device; the suite's line for the host's waits (COPY_WAIT_SHARE, the
# advisor's 5 %), so that this finding and the verdict's copy share agree.
COPY_SHARE = COPY_WAIT_SHARE
# The counter's name for a copy to a CUDA device that makes the host wait (pageable memory, or
# non_blocking=False): a sync that reading the loss less often does not remove.
UPLOAD = "host->device"

NOTEBOOKS = {
    "input-bound": "03_dataloader_workers.ipynb",
    "workers-cannot-import": "03_dataloader_workers.ipynb",
    "sync-bound": "08_item_hygiene.ipynb",
    "copy-bound": "09_device_placement.ipynb",
    "overhead-bound": "07_batch_size_and_accumulation.ipynb",
    "oversubscribed-threads": "05_cpu_threads.ipynb",
    "memory-tight": "10_training_memory.ipynb",
    "device-bound": "04_profiling.ipynb",  # the kernel view: which kernels take the time
    "device-bound, near its ceiling": "12_mixed_precision.ipynb",
    "device-bound, below its ceiling": "13_compiler_and_cuda_graphs.ipynb",
    "no-tensor-cores": "11_fp32_fast_paths.ipynb",  # TF32: one line; bf16 autocast is 10
    "memory-growth": "10_training_memory.ipynb",
    "straggler": "16_ddp.ipynb",  # the slowest rank sets DDP's pace
    "data-parallel": "16_ddp.ipynb",  # DDP instead; 13 measures what DataParallel costs
}
# A busy device: nothing to fix in the loop; what is left, by how near its ceiling it runs.
DEVICE_FIXES = {
    "device-bound": "nothing in the loop: the operator table (notebook 04) says which kernels "
    "take the time, and whether arithmetic or memory limits them",
    "device-bound, near its ceiling": "nothing in the loop: a faster format (bf16/fp16 autocast, "
    "TF32) or a faster device",
    "device-bound, below its ceiling": "more arithmetic per kernel and fewer bytes moved: a "
    "larger batch or width (notebook 07), bf16/fp16 autocast and channels_last (10, 11), "
    "fusion by torch.compile (13)",
}
DEVICE_BOUND = set(DEVICE_FIXES)
# Findings ranked above every cost: a loop whose memory grows fails however fast it is.
FIRST = ("memory-growth",)
# The straggler (--nproc N): under DDP every rank's step lasts as long as the slowest rank's, as
# each waits in the all-reduce for the last to arrive, so the slow rank is the one that waits
# LEAST in collectives. It is named when its wait (the median over its profiled steps) is below
# the others' by more than the noise: the ranks' step spreads and their waits' spreads (the
# largest interquartile range of any rank's steps), the spread of the other ranks' waits, and
# this share of the step: on a busy machine a rank held up for a few milliseconds makes its
# peers wait that long, and a spread over a few steps can miss it; 10 %: compare's run-to-run
# noise floor too (a smaller imbalance is not told from two runs of the same script).
STRAGGLER_FLOOR = 0.10


@dataclass
class Trial:
    """A what-if measured on the learner's own loop: the change, and the loop's speed with it."""

    change: str
    samples_per_s: float
    step_s: float  # the trial window's mean step: a speed (see Measured.throughput_step_s)


@dataclass
class Measured:
    """What the doctor measured (None: not measured, with the reason in `unseen`)."""

    device: str
    step_s: float
    steps: int
    # the timed window's wall time over its steps: a throughput, steady where steps are bursty
    # (workers hand over batches in bursts: the median step can be near 0 or a whole load)
    mean_step_s: float | None = None
    # the timed window's fastest step: what the step costs with the machine to itself, the
    # denominator the dispatch rate (also a best) is compared with, so a busy neighbour during
    # one of the two measurements does not tilt the overhead share
    best_step_s: float | None = None
    batch_size: int | None = None
    wait_s: float | None = None
    syncs_per_step: float | None = None
    sync_ops: dict[str, int] = field(default_factory=dict)
    # whose code each sync came from: {"where": the user's line, "library": None or the module
    # it happened in, "per_step"}
    sync_sites: list[dict] = field(default_factory=list)
    ops_per_step: float | None = None
    dispatch_s: float | None = None
    flops_per_step: float | None = None
    matmul_flops_per_s: float | None = None
    matmul_dtype: str = "float32"  # the dtype the ceiling was measured in: the hot ops' own
    threads: int = 1
    workers: int = 0
    cores: int = 1
    loader: dict | None = None
    hot_ops: list[dict] = field(default_factory=list)
    busy: float | None = None
    tensor_cores_idle: bool = False  # a GPU with TF32 tensor cores (8.0+), TF32 off ("highest")
    stall_s: float | None = None
    memory_peak: float | None = None
    memory_total: float | None = None
    trials: dict[str, Trial] = field(default_factory=dict)
    unseen: list[str] = field(default_factory=list)
    workers_blocked: str | None = None  # why DataLoader workers could not load the data set
    steps_needed: int = 0  # optimizer steps the windows take: warm-up, timed, profiled, counted
    step_counting: str = ""  # how a step was counted, in words (the first optimizer's steps)
    not_measured: list[str] = field(default_factory=list)  # windows the loop ended before
    # the timed window's step-to-step spread (interquartile range): `compare`'s noise band
    step_spread_s: float | None = None
    # memory over time (helpers/doctor/memory.py): the bytes held at each of the memory window's
    # step ends, their least-squares slope per step, the residual spread, the slope's standard
    # error, what was sampled, and the lines whose tensors survived the window
    memory_samples: list[float] = field(default_factory=list)
    memory_slope: float | None = None
    memory_spread: float | None = None
    memory_slope_error: float | None = None
    memory_source: str = ""
    memory_sites: list[dict] = field(default_factory=list)
    # time a step has a collective in flight (helpers/doctor/profiled.py: COLLECTIVES), the
    # profiled steps' median, and their spread (interquartile range): None when the script ran
    # none and formed no process group
    collective_s: float | None = None
    collective_spread_s: float | None = None
    data_parallel: bool = False  # the script built a torch.nn.DataParallel
    # copies between host and device in the profiled window (CUDA: copies.account), per step:
    # by direction, host memory (pinned/pageable) and blocking or not; None: not seen here
    copies: dict | None = None

    @property
    def throughput_step_s(self) -> float:
        """The step as a speed: the window's mean where measured (the median of bursty steps,
        batches handed over by workers, undercounts the time they take), else the median."""
        return self.mean_step_s or self.step_s

    @property
    def samples_per_s(self) -> float | None:
        return self.batch_size / self.throughput_step_s if self.batch_size else None

    def fair_threads(self) -> int:
        """Intra-op threads that leave a core to each DataLoader worker (at least one)."""
        return max(1, self.cores - self.workers)


@dataclass
class Finding:
    kind: str
    evidence: str
    share: float | None
    fix: str
    notebook: str
    predicted_speedup: float | None = None
    predicted_samples_per_s: float | None = None
    rule: str = ""


def _predict(f: Finding, m: Measured, trial: str) -> Finding:
    t = m.trials.get(trial)
    if t is not None:
        f.predicted_speedup = (
            m.throughput_step_s / t.step_s
            if not m.batch_size
            else t.samples_per_s / m.samples_per_s
        )
        f.predicted_samples_per_s = t.samples_per_s if m.batch_size else None
    return f


def input_bound(m: Measured) -> Finding | None:
    if m.wait_s is None:
        return None
    share = m.wait_s / m.step_s
    if share < INPUT_WAIT_SHARE:
        return None
    workers = m.loader.get("num_workers") if m.loader else m.workers
    first = "the data set in a module (see workers-cannot-import), then " * bool(m.workers_blocked)
    fix = (
        f"{first}DataLoader(num_workers={max(1, m.cores)}, persistent_workers=True"
        f"{', pin_memory=True' if m.device == 'cuda' else ''}), or lighter per-sample work"
    )
    if workers and workers >= m.cores:  # more workers than cores only take turns
        fix = (
            f"lighter per-sample work (decode once and keep the result, smaller images, augment "
            f"on the device), or more cores: {workers} workers already have all {m.cores}"
        )
    return _predict(
        Finding(
            "input-bound",
            f"waits {1e3 * m.wait_s:.1f} ms for data of a {1e3 * m.step_s:.1f} ms step "
            f"({100 * share:.0f} %); num_workers={workers}, {m.cores} usable cores"
            + ("; workers not tried: they could not load the data set" * bool(m.workers_blocked)),
            share,
            fix,
            NOTEBOOKS["input-bound"],
            rule=f"data wait >= {INPUT_WAIT_SHARE:.0%} of the step "
            "(the TensorBoard profiler advisor's rule)",
        ),
        m,
        "workers",
    )


def workers_cannot_import(m: Measured) -> Finding | None:
    """Workers, the input-bound fix, would fail on this loop: said instead of tried."""
    if not m.workers_blocked:
        return None
    return Finding(
        "workers-cannot-import",
        m.workers_blocked,
        None,
        "move the Dataset (and any collate_fn, worker_init_fn, transform) into a module, a .py "
        "file beside the notebook or script (%%writefile in a notebook), and import it from there",
        NOTEBOOKS["workers-cannot-import"],
        rule="workers start by spawn/forkserver and what they unpickle is defined in an "
        "unimportable __main__ or cannot be pickled",
    )


READ_FIX = "keep the loss on the device (loss.detach()) and read it every k steps, not every step"
UPLOAD_FIX = (
    "copy batches from pinned memory without waiting: DataLoader(pin_memory=True) and "
    "X.to(device, non_blocking=True)"
)


def _only_copies(m: Measured) -> bool:
    """Every sync counted is a copy to the device that waits: copy-bound, not sync-bound."""
    return bool(m.sync_ops) and all(UPLOAD in k for k in m.sync_ops)


def _sync_advice(m: Measured) -> tuple[str, str, str]:
    """(what the syncs are, the fix, its notebook): a read every k steps removes only reads; a
    copy to the device from pageable memory or with non_blocking=False syncs every step anyway,
    so the read fix alone would promise a gain the loop cannot have."""
    uploads = sum(v for k, v in m.sync_ops.items() if UPLOAD in k)
    reads = sum(m.sync_ops.values()) - uploads
    if not uploads:
        return "", READ_FIX, NOTEBOOKS["sync-bound"]
    if not reads:
        return (
            "; no read to remove: copies to the device that wait (pageable or blocking)",
            UPLOAD_FIX,
            NOTEBOOKS["copy-bound"],
        )
    return (
        "; reading less often alone gains nothing: the copies to the device still wait every step",
        f"both: {READ_FIX}; and {UPLOAD_FIX} (notebook {NOTEBOOKS['copy-bound']})",
        NOTEBOOKS["sync-bound"],
    )


def _blame(m: Measured) -> tuple[str, str | None]:
    """(whose code the syncs are in, a fix that replaces the read/copy fix when none of them
    is the user's): a sync inside a library (an L-BFGS line search reading its loss) cannot be
    removed by reading less often in the user's loop; what the user can change is the call."""
    if not m.sync_sites:
        return "", None
    mine = sum(s["per_step"] for s in m.sync_sites if s["library"] is None)
    libs: dict[str, set[str]] = {}
    for s in m.sync_sites:
        if s["library"] is not None:
            libs.setdefault(s["library"], set()).add(s["where"])
    inside = "; ".join(
        f"inside {lib} (called from {', '.join(sorted(w))})" for lib, w in libs.items()
    )
    if not libs:
        lines = ", ".join(s["where"] for s in m.sync_sites[:3])
        return f"; all in your code ({lines})", None
    if not mine:
        return (
            f"; none in your code: {inside}",
            "nothing to remove in your own lines: the library reads these values by design; what "
            "you can change is how you call it (its settings, e.g. LBFGS's max_iter, or another "
            "optimizer or library)",
        )
    return f"; {mine:g} per step in your code, the rest {inside}", None


def _stall_share(m: Measured) -> float | None:
    """The host's measured wait for the device, as a share of the step (CUDA only): a stall
    costs only while the device idles."""
    if m.stall_s is None:
        return None
    stall = m.stall_s - (m.copies["held_s"] if m.copies is not None else 0.0)
    share = min(1.0, max(0.0, stall) / m.step_s)
    return share if m.busy is None else min(share, 1 - m.busy)


def sync_bound(m: Measured) -> Finding | None:
    """Syncs every step (copy-bound when every one is a copy to the device that waits; where
    the profiler told the copies apart, `copy_bound` says that, with what they cost)."""
    if not m.syncs_per_step or m.syncs_per_step < SYNCS_PER_STEP:
        return None
    if m.copies is not None and _only_copies(m):
        return None
    ops = ", ".join(f"{k} x{v}" for k, v in sorted(m.sync_ops.items()))
    which, fix, notebook = _sync_advice(m)
    whose, library_fix = _blame(m)
    which += whose
    fix = library_fix or fix
    kind, line = (
        ("copy-bound", COPY_WAIT_SHARE) if _only_copies(m) else ("sync-bound", SYNC_STALL_SHARE)
    )
    if m.stall_s is None:  # a CPU: counted, and no cost claimed
        return Finding(
            kind,
            f"{m.syncs_per_step:g} {'syncs' if which else 'reads of a tensor'} per step "
            f"({ops}): would synchronise on a GPU; a CPU pays nothing for them{which}",
            None,
            fix,
            notebook,
            rule=f">= {SYNCS_PER_STEP:g} sync per step, counted",
        )
    share = _stall_share(m)
    if share < line:
        return None
    return Finding(
        kind,
        f"{m.syncs_per_step:g} syncs per step ({ops}); the host waited "
        f"{1e3 * (m.stall_s - (m.copies or {}).get('held_s', 0.0)):.2f} ms per step"
        + " (besides its copies to the device)" * (m.copies is not None)
        + which,
        share,
        fix,
        notebook,
        rule=f"measured stall >= {line:.0%} of the step",
    )


def _overhead_share(m: Measured) -> float | None:
    """The ops a step dispatches times this machine's cost per op, over the fastest step."""
    if not m.ops_per_step or not m.dispatch_s:
        return None
    return min(1.0, m.ops_per_step * m.dispatch_s / (m.best_step_s or m.step_s))


def overhead_bound(m: Measured) -> Finding | None:
    share = _overhead_share(m)
    if share is None or share < OVERHEAD_SHARE:
        return None
    step_s, dispatch = m.best_step_s or m.step_s, m.ops_per_step * m.dispatch_s
    # past the step: this step's ops cost less each than those of the tiny-op reference step
    part = (
        f"{100 * share:.0f} % of the {1e3 * step_s:.2f} ms fastest step"
        if dispatch < step_s
        else f"{1e3 * dispatch:.2f} ms, at least the whole {1e3 * step_s:.2f} ms fastest step"
    )
    return _predict(
        Finding(
            "overhead-bound",
            f"{m.ops_per_step:.0f} ops per step x {1e6 * m.dispatch_s:.1f} us per op of a "
            f"step made of tiny ops (measured) = {part}",
            share,
            "more work per op: a larger batch, fewer and larger ops (torch.compile, fused layers)",
            NOTEBOOKS["overhead-bound"],
            rule=f"dispatch cost >= {OVERHEAD_SHARE:.0%} of the step (measured here)",
        ),
        m,
        "batch x2",
    )


def oversubscribed(m: Measured) -> Finding | None:
    fair = m.fair_threads()
    if m.threads <= fair:
        return None
    f = Finding(
        "oversubscribed-threads",
        f"{m.threads} intra-op threads + {m.workers} DataLoader workers on {m.cores} usable cores",
        None,
        f"torch.set_num_threads({fair})",
        NOTEBOOKS["oversubscribed-threads"],
        rule="intra-op threads + workers > usable cores",
    )
    t = m.trials.get("threads")
    if t is not None:
        f.share = max(0.0, 1 - t.step_s / m.throughput_step_s)
    return _predict(f, m, "threads")


def device_idle(m: Measured) -> Finding | None:
    """The device idles and no measured wait explains it: overhead-bound by `bottleneck`'s last
    rule (the host does not keep the device fed), where the dispatch count alone did not say so."""
    v = verdict(m)
    if v.kind != "overhead-bound" or overhead_bound(m) is not None:
        return None
    busy = v.shares["busy"]
    return _predict(
        Finding(
            "overhead-bound",
            f"device busy {100 * busy:.0f} % of the step, and no wait measured at its line",
            1 - busy,
            "a larger batch, fewer and larger ops (torch.compile, CUDA graphs)",
            NOTEBOOKS["overhead-bound"],
            rule=v.rule + " (the TensorBoard advisor's device-busy rule)",
        ),
        m,
        "batch x2",
    )


COPY_FIXES = {
    "pageable": "pin the host memory, so the device reads it directly instead of through a "
    "staging copy: DataLoader(pin_memory=True), or x.pin_memory() once for data kept on the "
    "host (pageable vs pinned: notebook 09_device_placement.ipynb)",
    "blocking": "copy without waiting, from pinned memory: x.to(device, non_blocking=True), so "
    "the host queues the next kernels while the copy runs (notebook 09_device_placement.ipynb)",
    "bytes": "move fewer bytes: images as uint8 to the device and converted to float there "
    "(notebook 06_gpu_data_pipelines.ipynb)",
    "keep": "keep on the device what every step reuses: move the data set (or the model, or a "
    "buffer) there once, not each step (notebooks 06_gpu_data_pipelines.ipynb, "
    "09_device_placement.ipynb)",
    "reads": "read from the device less: keep outputs and metrics there and copy them to the "
    "host every k steps (notebook 08_item_hygiene.ipynb)",
}


def copy_bound(m: Measured) -> Finding | None:
    """Copies between host and device, told apart by the profiler (CUDA): what they cost a step
    (copying with nothing computing beside it, or the host held by a copy to the device), with
    the fix for each kind seen (pageable: pin; blocking: non_blocking; always fewer bytes)."""
    c = m.copies
    if c is None or c["share"] < COPY_SHARE:
        return None
    kinds = c["kinds"]
    parts = "; ".join(
        f"{k['direction']} {k['memory']}, {'blocking' if k['blocking'] else 'non-blocking'}: "
        f"{k['per_step']:g} a step, {1e3 * k['transfer_s']:.2f} ms on the device"
        + (
            f", the host held {1e3 * k['held_s']:.2f} ms"
            + " (for the kernels queued before them too: a read, the sync rule's)"
            * (k["direction"] == "device->host")
            if k["blocking"]
            else ""
        )
        for k in kinds
    )
    # pinning and non_blocking for the copies to the device; reading less where the copies
    # from it move more than those to it (a loss read each step moves a few bytes)
    ups = [k for k in kinds if k["direction"] == "host->device"]
    seen = {k["memory"] for k in ups} | {"blocking" for k in ups if k["blocking"]}
    down = sum(k["transfer_s"] for k in kinds) - sum(k["transfer_s"] for k in ups)
    fixes = [COPY_FIXES[f] for f in ("pageable", "blocking") if f in seen]
    fixes += [COPY_FIXES["bytes"], COPY_FIXES["keep"]]
    if down > sum(k["transfer_s"] for k in ups):
        fixes.insert(0, COPY_FIXES["reads"])
    return Finding(
        "copy-bound",
        f"copies between host and device cost {1e3 * c['exposed_s']:.2f} ms of each "
        f"{1e3 * c['step_s']:.2f} ms profiled step ({100 * c['share']:.0f} %; on the device "
        f"{1e3 * c['transfer_s']:.2f} ms, the host held {1e3 * c['held_s']:.2f} ms by copies to "
        f"the device): {parts}",
        c["share"],
        "; ".join(fixes),
        NOTEBOOKS["copy-bound"],
        rule=f"copies >= {COPY_SHARE:.0%} of the step: copying with no kernel beside it, or the "
        "host held by a copy to the device (the advisor's 5 % for a wait, the verdict's copy line)",
    )


def memory_tight(m: Measured) -> Finding | None:
    if (
        not m.memory_peak
        or not m.memory_total
        or m.memory_peak / m.memory_total < MEMORY_PEAK_SHARE
    ):
        return None
    return Finding(
        "memory-tight",
        f"peak {m.memory_peak / 2**30:.2f} GiB of {m.memory_total / 2**30:.2f} GiB",
        None,
        "a smaller batch with gradient accumulation, or activation checkpointing",
        NOTEBOOKS["memory-tight"],
        rule=f"peak >= {MEMORY_PEAK_SHARE:.0%} of memory (the TensorBoard advisor's rule)",
    )


def no_tensor_cores(m: Measured) -> Finding | None:
    fp32 = [h["op"] for h in m.hot_ops if " float32 " in h["op"]]
    if not (m.tensor_cores_idle and fp32):
        return None
    return Finding(
        "no-tensor-cores",
        f"hot ops in float32 ({', '.join(fp32)}) with TF32 off on a GPU with tensor cores",
        None,
        "torch.backends.cuda.matmul.fp32_precision = 'tf32' (TF32, notebook 11), or "
        "torch.autocast('cuda', dtype=torch.bfloat16) (notebook 12)",
        NOTEBOOKS["no-tensor-cores"],
        rule="fp32 hot ops, TF32 off (the TensorBoard advisor's 0 % tensor-core rule)",
    )


MEMORY_FIX = (
    "keep values, not graphs: .detach() what you keep for later (bank.append(feats.detach()), "
    "moved to the CPU if it is large), .item() a number when you log it (every k steps), and "
    "del what you no longer need"
)


def memory_growth(m: Measured) -> Finding | None:
    """The memory held at each step's end grows: the run will end in an out-of-memory error
    however fast its steps are, so it is named first and no all-clear is given beside it."""
    from .memory import GROWTH_FLOOR, SIGNIFICANCE, growing

    if m.memory_slope is None or not growing(m.memory_slope, m.memory_slope_error or 0.0):
        return None
    mib = 2**20
    where = (
        "; tensors still alive from earlier steps were made at "
        + ", ".join(
            f"{s['where']} ({s['bytes'] / mib:.2f} MiB from {s['steps']} steps)"
            for s in m.memory_sites
        )
        if m.memory_sites
        else "; the line that made them was not seen (tensors made outside the dispatcher, "
        "or freed and replaced by others)"
    )
    return Finding(
        "memory-growth",
        f"memory grows {m.memory_slope / mib:.2f} MiB a step (least-squares slope over "
        f"{len(m.memory_samples)} steps, residual spread {(m.memory_spread or 0.0) / mib:.3f} "
        f"MiB; {m.memory_source}){where}",
        None,
        MEMORY_FIX,
        NOTEBOOKS["memory-growth"],
        rule=f"slope >= {GROWTH_FLOOR // 2**10} KiB a step and > {SIGNIFICANCE:g} standard "
        "errors of the slope",
    )


def data_parallel(m: Measured) -> Finding | None:
    """The script built a torch.nn.DataParallel: DistributedDataParallel instead."""
    if not m.data_parallel:
        return None
    here = " (here, without a GPU, it only calls the module)" * (m.device == "cpu")
    return Finding(
        "data-parallel",
        "the model runs in torch.nn.DataParallel: one process and one Python thread drive every "
        "device, and each step scatters the batch, copies the model to every device and gathers "
        f"the outputs on the first{here}",
        None,
        "torch.nn.parallel.DistributedDataParallel, one process per device (torchrun; "
        "python -m helpers.doctor --nproc N diagnoses its ranks); notebook "
        "15_data_parallel.ipynb measures what DataParallel's scatter, replicate and gather cost",
        NOTEBOOKS["data-parallel"],
        rule="torch.nn.DataParallel built: PyTorch's documentation recommends "
        "DistributedDataParallel instead, even on one machine",
    )


RULES = (
    memory_growth,
    input_bound,
    workers_cannot_import,
    sync_bound,
    copy_bound,
    overhead_bound,
    oversubscribed,
    device_idle,
    memory_tight,
    no_tensor_cores,
    data_parallel,
)


def shares(m: Measured) -> dict[str, float | None]:
    """The step's measured shares, as `diagnose.bottleneck` reads them (None: not measured).
    Where kernel time is not read (a CPU, MPS, XPU), the device's share is the step less the
    host's measured data wait and dispatch: the time the host spends in operators (a CPU runs
    them on its own cores) or blocked on the device."""
    wait = None if m.wait_s is None else min(1.0, m.wait_s / m.step_s)
    overhead, stall = _overhead_share(m), _stall_share(m)
    busy = m.busy
    if busy is None and m.device != "cuda" and wait is not None and overhead is not None:
        busy = max(0.0, 1.0 - wait - overhead)
    rate = None
    if m.flops_per_step and m.matmul_flops_per_s and m.step_s > (m.wait_s or 0.0):
        rate = m.flops_per_step / (m.step_s - (m.wait_s or 0.0)) / m.matmul_flops_per_s
    only_copies = stall is not None and _only_copies(m)
    if m.copies is not None:  # told apart by the profiler (CUDA); the stall is the rest
        copy, sync = m.copies["share"], None if only_copies else stall
    else:
        copy, sync = (stall, None) if only_copies else (None, stall)
    return {
        "data_wait": wait,
        "copy": copy,
        "sync": sync,
        "overhead": overhead,
        "busy": busy,
        "rate": rate,
    }


def verdict(m: Measured) -> diagnose.Verdict:
    """The loop's one verdict: the suite's classifier on what was measured; inconclusive when a
    window did not fill (no verdict rests on what was not measured)."""
    s = shares(m)
    if inconclusive(m):
        return diagnose.Verdict("inconclusive", s, "not measured: " + "; ".join(m.not_measured))
    return diagnose.bottleneck(**s)


def device_bound(m: Measured) -> Finding | None:
    """The answer when the device, not the host, bounds the loop: nothing to fix in the loop;
    how near its ceiling the step's arithmetic runs, where that was measured."""
    v = verdict(m)
    if v.kind not in DEVICE_BOUND:
        return None
    s = v.shares
    busy = (
        f"device busy {100 * s['busy']:.0f} % of the step"
        if m.busy is not None
        else f"{100 * s['busy']:.0f} % of the step in operators or blocked on the device (the "
        "step less its waits and dispatch)"
    )
    if s["rate"] is not None:
        busy += (
            f", at {100 * s['rate']:.0f} % of this machine's measured {m.matmul_dtype} matmul "
            f"rate ({m.matmul_flops_per_s / 1e9:.1f} GFLOP/s)"
        )
    # below the ceiling the device is busy with small or memory-bound kernels: the loop can
    # give it more work per kernel, so that is not "nothing to fix"
    below = v.kind == "device-bound, below its ceiling"
    return Finding(
        v.kind,
        f"{'the device is busy far below its ceiling' if below else 'nothing to fix in the loop'}:"
        f" {busy}",
        None,
        DEVICE_FIXES[v.kind],
        NOTEBOOKS[v.kind],
        rule=v.rule,
    )


def inconclusive(m: Measured) -> bool:
    """A window did not fill: the rules that read it were not evaluated, so no verdict (not
    even "nothing to fix") may rest on them."""
    return bool(m.not_measured)


def refuted(f: Finding) -> bool:
    """The fix was tried on the loop and made it slower: the rule fired, the measurement says no."""
    return f.predicted_speedup is not None and f.predicted_speedup < 1.0


def findings(m: Measured) -> list[Finding]:
    """The findings, ranked: measured costs by share, then counted ones, then the refuted; a
    device-bound verdict (nothing to fix in the loop) only when every window filled and no
    wait reached its line (a fix that measured slower leaves its wait where it was)."""
    found = [f for rule in RULES if (f := rule(m)) is not None]
    for f in filter(refuted, found):
        f.evidence += (
            f"; but the fix, tried on this loop, made it slower ({f.predicted_speedup:.2f}x):"
            " it does not pay here"
        )
    if not any(f.kind in FIRST for f in found):  # memory grows: no all-clear
        if (busy := device_bound(m)) is not None:
            found.append(busy)
    return ranked(found)


def ranked(found: list[Finding]) -> list[Finding]:
    """Measured costs by share, then counted ones, then the refuted; FIRST above them all."""
    return sorted(
        found,
        key=lambda f: (f.kind not in FIRST, refuted(f), f.share is None, -(f.share or 0.0)),
    )


def straggler(ranks: list[dict]) -> dict | None:
    """The rank that waits least in collectives, where it waits less than the others by more
    than the noise (STRAGGLER_FLOOR): {"rank", "collective_s", "others_s" (the others' median),
    "gap_s", "threshold_s", "step_s"}. None: a balanced job, or collectives not measured on
    every rank. `ranks`: each rank's {"rank", "step_s", "step_spread_s", "collective_s",
    "collective_spread_s"}."""
    if len(ranks) < 2 or any(r.get("collective_s") is None for r in ranks):
        return None
    slow = min(ranks, key=lambda r: r["collective_s"])
    others = [r["collective_s"] for r in ranks if r is not slow]
    step = statistics.median(r["step_s"] for r in ranks)
    gap = statistics.median(others) - slow["collective_s"]
    threshold = max(
        STRAGGLER_FLOOR * step,
        max(r.get(k) or 0.0 for r in ranks for k in ("step_spread_s", "collective_spread_s")),
        max(others) - min(others),
    )
    if gap <= threshold:
        return None
    return {
        "rank": slow["rank"],
        "collective_s": slow["collective_s"],
        "others_s": statistics.median(others),
        "gap_s": gap,
        "threshold_s": threshold,
        "step_s": step,
    }


def straggler_finding(s: dict) -> Finding:
    """The straggler as a finding: what the others wait for it is the share it costs."""
    ms = {k: f"{1e3 * s[k]:.1f}" for k in ("collective_s", "others_s", "gap_s", "step_s")}
    return Finding(
        "straggler",
        f"rank {s['rank']} is the straggler: it waits {ms['collective_s']} ms a step in "
        f"collectives, the other ranks {ms['others_s']} ms (median), so they wait "
        f"{ms['gap_s']} ms of each {ms['step_s']} ms step for it (the named gap beyond "
        f"{1e3 * s['threshold_s']:.1f} ms of noise)",
        min(1.0, s["gap_s"] / s["step_s"]),
        f"give rank {s['rank']} no more work than the others: equal shards (DistributedSampler), "
        "the same per-sample work, logging, evaluation and checkpoints on every rank alike or off "
        "the step, and a core or device of its own (a busy neighbour slows one rank)",
        NOTEBOOKS["straggler"],
        rule=f"a rank's time in collectives below the others' by more than the largest of "
        f"{STRAGGLER_FLOOR:.0%} of the step, the ranks' spreads of step and of time in "
        "collectives, and the other ranks' spread (under DDP every step lasts as long as the "
        "slowest rank's, which waits least)",
    )


def measured_from(d: dict) -> Measured:
    """A `Measured` back from its --json form (`as_dict`'s "measured")."""
    names = {f.name for f in fields(Measured)}
    m = Measured(**{k: v for k, v in d.items() if k in names})
    m.trials = {k: Trial(**t) for k, t in m.trials.items()}
    return m


def as_dict(m: Measured, found: list[Finding]) -> dict:
    """The `--json` report (SCHEMA_FILE): {"schema", "inconclusive", "verdict": {kind, shares,
    rule}, "measured": {...}, "findings": [ranked {kind, evidence, share, fix, notebook,
    predicted_speedup, predicted_samples_per_s, rule}]}."""
    measured = asdict(m)
    measured["samples_per_s"] = m.samples_per_s
    return {
        "schema": SCHEMA,
        "inconclusive": inconclusive(m),
        "verdict": asdict(verdict(m)),
        "measured": measured,
        "findings": [asdict(f) for f in found],
    }
