"""`--what-if` from the command line: the script re-run, unmodified, for the same steps, with the
setting of the top finding a re-run can act on changed at the child's start; the measured
speed-up beside the predicted.

What a re-run can change from outside a script: intra-op threads (held against the script's own
`torch.set_num_threads` calls: the child wraps it), and the fp32 precision of matmuls and
convolutions (torch's public setters), always; DataLoader workers and pin_memory only when asked
(`--what-if-loader`): the child wraps `DataLoader.__init__` for that (for input-bound, workers;
for copy-bound with copies from pageable memory, pin_memory alone: a copy's non_blocking flag
and its bytes are the script's own code). The rule against
patching torch protects a learner's own process; the doctor's child is its lab, and the report
says what was changed there.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import json
import os
import statistics
import time
from collections.abc import Callable, Mapping

import psutil

from .. import devices

# The environment variable that carries a change into the doctor's child (JSON).
ENV = "FTG_DOCTOR_WHAT_IF"
# What the child holds changed until it exits.
_HELD = contextlib.ExitStack()
# How near the re-run must land to its prediction for the prediction to hold: within this
# share of the measured speed-up (a re-run is another run: compare's run-to-run noise is 10 %,
# and the price's terms are each measured once).
PREDICTION_BAND = 0.25
# Findings whose fix a re-run can apply, and what a re-run of each changes.
LOADER_FINDINGS = {"input-bound"}
ALWAYS = {"oversubscribed-threads", "no-tensor-cores"}


def change_for(finding: dict, measured: dict, loader: bool) -> tuple[dict | None, str]:
    """(the change for the child, in words) for a finding; (None, why not) when a re-run from
    outside the script cannot apply its fix."""
    kind, cores = finding["kind"], max(1, int(measured.get("cores") or 1))
    if kind == "oversubscribed-threads":
        threads = max(1, cores - int(measured.get("workers") or 0))
        return {"threads": threads}, (
            f"torch.set_num_threads({threads}) at the script's start, and the script's own "
            "calls held at it (in the doctor's child only)"
        )
    if kind == "no-tensor-cores":
        return {"fp32_precision": "tf32"}, "fp32 matmuls and convolutions in TF32"
    if kind == "copy-bound":
        kinds = (measured.get("copies") or {}).get("kinds", [])
        if not any(k["memory"] == "pageable" and k["direction"] == "host->device" for k in kinds):
            return None, (
                "its fix is the script's own code (non_blocking=True, fewer bytes, data kept on "
                "the device): a re-run from outside cannot make it"
                if kinds
                else "the copies were not told apart here (CUDA only): no setting to try"
            )
        if not loader:
            return None, (
                "its first fix is the DataLoader's pin_memory: add --what-if-loader to let the "
                "doctor's child set it (the script's file is never changed)"
            )
        return {"loader": {"pin_memory": True}}, (
            "every DataLoader built with pin_memory=True (in the doctor's child only; copies "
            "made from tensors the script holds itself stay pageable)"
        )
    if kind in LOADER_FINDINGS:
        if not loader:
            return None, (
                "its fix is the DataLoader's settings: add --what-if-loader to let the doctor's "
                "child change them (the script's file is never changed)"
            )
        pin = measured.get("device") == "cuda"
        change = {"loader": {"num_workers": cores, "persistent_workers": True, "pin_memory": pin}}
        words = f"every DataLoader built with num_workers={cores}, persistent_workers=True" + (
            ", pin_memory=True" if pin else ""
        )
        return change, words + " (in the doctor's child only)"
    return None, (
        f"a {kind} fix changes the script's own code (batch size, model, loop): a re-run from "
        "outside cannot make it; doctor.watch in a notebook tries it on the loop itself"
    )


def prediction(
    finding: dict, measured: dict, change: dict, pricing: dict | None = None
) -> tuple[float | None, str]:
    """The prediction the re-run is judged against, made from the first run alone, and its
    words: a what-if the doctor measured on the loop (the threads trial); for workers, the step
    priced from what the first run measured (`price_workers`: the data wait, the compute and
    the cores it keeps busy, the cores other processes use, one batch's hand-over), or why it
    cannot be predicted; else none."""
    if finding.get("predicted_speedup"):
        return float(finding["predicted_speedup"]), ""
    loader, wait = change.get("loader"), measured.get("wait_s")
    if not (loader and wait and loader.get("num_workers")):  # a pin_memory what-if: none
        return None, ""
    if measured.get("workers"):
        return None, (
            f"cannot be predicted here: the script's loader already runs {measured['workers']} "
            "workers, which the re-run keeps (it adds workers only where there were none)"
        )
    pricing = pricing or {}
    step = measured.get("mean_step_s") or measured["step_s"]
    unreached = ""
    if pricing.get("load_cpu_share") is None and pricing.get("main_cores") is not None:
        # the loader was not reachable (built in the for statement): the main process's CPU
        # over the step is all counted as loading (any split between loading and compute
        # needs the same cores in `price_workers`), and the hand-over is left out, as said
        share_of_step = wait / measured["step_s"]
        pricing.update(
            load_cpu_share=min(1.0, pricing["main_cores"] / max(share_of_step, 1e-9)),
            handover_main_s=0.0,
            handover_worker_s=0.0,
        )
        unreached = (
            " (the script's DataLoader was not reachable, " + pricing.get("why", "") + ": "
            "the main process's CPU is priced as loading, and a batch's hand-over from a "
            "worker is left out)"
        )
    needed = ("main_cores", "others_cores", "load_cpu_share", "handover_main_s")
    if any(pricing.get(k) is None for k in needed):
        return None, "cannot be predicted here: " + pricing.get(
            "why", "what workers would cost was not measured"
        )
    terms = {k: pricing[k] for k in (*needed, "handover_worker_s")}
    if loader.get("pin_memory"):  # the pin_memory thread's copy: in the main process too
        terms["handover_main_s"] += pricing.get("pin_s") or 0.0
    priced = price_workers(
        step_s=step,
        wait_s=wait / measured["step_s"] * step,  # the wait's share of the step, as measured
        workers=int(loader["num_workers"]),
        cores=max(1, int(measured.get("cores") or 1)),
        **terms,
    )
    pricing.update({k: v for k, v in priced.items() if k not in ("predicted_speedup", "why")})
    return priced["predicted_speedup"], priced["why"] + unreached


def predicted_speedup(
    finding: dict, measured: dict, change: dict, pricing: dict | None = None
) -> float | None:
    """`prediction`'s number alone (None: no prediction)."""
    return prediction(finding, measured, change, pricing)[0]


def apply_in_child() -> str | None:
    """In the doctor's child, before the script runs: make the change `ENV` carries."""
    raw = os.environ.pop(ENV, None)
    if not raw:
        return None

    change = json.loads(raw)
    if "threads" in change:
        _threads_held_at(int(change["threads"]))
    if change.get("fp32_precision") == "tf32":  # for the rest of the child's life
        _HELD.enter_context(devices.fp32_precision("tf32"))
    if "loader" in change:
        _loaders_with(change["loader"])
    return raw


def _threads_held_at(threads: int) -> None:
    """Set the intra-op threads and hold them there: a script that calls
    `torch.set_num_threads` itself (most that oversubscribe do) would undo a change made only at
    its start, and the re-run would measure the loop unchanged."""
    import torch

    original = torch.set_num_threads
    original(threads)

    @functools.wraps(original)
    def held(_requested: int) -> None:
        original(threads)

    torch.set_num_threads = held  # the doctor's child only, for its --what-if


def _loaders_with(settings: dict) -> None:
    """Every DataLoader the script builds gets `settings` (workers only where it had none)."""
    from torch.utils.data import DataLoader

    original = DataLoader.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(self, *args, **kwargs):  # DataLoader's own signature
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        if not arguments.get("num_workers"):
            arguments.update(settings)
        elif settings.get("pin_memory"):
            arguments["pin_memory"] = True
        original(*bound.args, **bound.kwargs)

    DataLoader.__init__ = init  # the doctor's child only, asked for by --what-if-loader


def compare(
    before: dict, after: dict, finding: dict, change: dict, words: str, pricing: dict | None = None
) -> dict:
    """The what-if's record: predicted and measured speed-up of the timed window's mean step
    (a throughput: with workers, batches arrive in bursts and the median step misleads); the
    prediction's words and, for workers, what it was priced from."""
    step_before, step_after = (r["measured"]["mean_step_s"] for r in (before, after))
    measured = step_before / step_after if step_after else None
    pricing = dict(pricing) if pricing else None
    predicted, why = prediction(finding, before["measured"], change, pricing)
    record = {
        "finding": finding["kind"],
        "change": words,
        "predicted_speedup": predicted,
        "measured_speedup": measured,
        "step_s_before": step_before,
        "step_s_after": step_after,
    }
    if why:
        record["prediction"] = why
    if pricing:
        record["pricing"] = {k: v for k, v in pricing.items() if k != "why"}
    return record


def held_up(predicted: float, measured: float) -> bool:
    """Whether a re-run's measured speed-up lands within PREDICTION_BAND of the prediction."""
    return abs(predicted - measured) <= PREDICTION_BAND * measured


def render(w: dict) -> str:
    predicted = w["predicted_speedup"]
    measured = w["measured_speedup"]
    head = f"What-if for {w['finding']}, re-run with {w['change']}: "
    if measured is None:
        return head + "the re-run gave no timing"
    why = w.get("prediction", "")
    if predicted:
        said = f"predicted {predicted:.2f}x, "
    elif why:
        said = "not predicted (it cannot be predicted here, below), "
    else:
        said = "no prediction, "
    verdict = (
        "it helps"
        if measured > 1.02
        else "it does not help here: the step did not get faster (2 % or more)"
    )
    if predicted:
        held = held_up(predicted, measured)
        verdict += (
            f"; the prediction held (within {PREDICTION_BAND:.0%} of the measured)"
            if held
            else f"; the prediction missed (by more than {PREDICTION_BAND:.0%} of the measured)"
        )
    text = (
        head + f"{said}measured {measured:.2f}x (mean step {1e3 * w['step_s_before']:.2f} -> "
        f"{1e3 * w['step_s_after']:.2f} ms): {verdict}"
    )
    return text + (f"\n  the prediction, from the first run alone: {why}" if why else "")


# --- pricing workers before the re-run ---------------------------------------------------------
# The environment variable that asks the doctor's first child to measure what workers would cost
# (--what-if-loader): its CPU use over the timed window, and one batch's load and hand-over.
PRICE_ENV = "FTG_DOCTOR_PRICE"
# Batches moved through the hand-over, and the most bytes moved in all (the check stays < ~1 s).
HANDOVER_BATCHES = 3
HANDOVER_BYTES = 1 << 30
# Batches loaded in the main process to see how much of the data wait is CPU (not sleeps, I/O).
LOAD_BATCHES, LOAD_SECONDS = 2, 0.5


def _busy_seconds() -> float:
    """CPU seconds the whole machine has run (every core, every process)."""
    t = psutil.cpu_times()
    return (
        sum(t)
        - t.idle
        - getattr(t, "iowait", 0.0)
        - getattr(t, "guest", 0.0)
        - getattr(t, "guest_nice", 0.0)
    )


def _own_seconds() -> tuple[float, float]:
    """CPU seconds of this process, and of the processes below it (DataLoader workers)."""
    me = psutil.Process()
    below = 0.0
    for c in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            below += sum(c.cpu_times()[:2])
    return sum(me.cpu_times()[:2]), below


class CpuClock:
    """The main process's busy cores over a window (its CPU seconds over wall seconds, all its
    threads), and the cores other processes kept busy meanwhile (the machine's CPU seconds less
    this process's and its children's)."""

    def __init__(self) -> None:
        self.start_at: tuple[float, float, float, float] | None = None
        self.result: dict | None = None

    def start(self) -> None:
        self.start_at = (time.perf_counter(), _busy_seconds(), *_own_seconds())

    def stop(self) -> None:
        if self.start_at is None or self.result is not None:
            return
        wall0, machine0, me0, below0 = self.start_at
        wall, machine, me, below = time.perf_counter(), _busy_seconds(), *_own_seconds()
        span = wall - wall0
        if span <= 0:
            return
        others = (machine - machine0) - (me - me0) - max(0.0, below - below0)
        self.result = {"main_cores": (me - me0) / span, "others_cores": max(0.0, others / span)}


def _loaders() -> list:
    """The DataLoaders alive in the script's process (looked for once, after the windows)."""
    from torch.utils.data import DataLoader

    return [o for o in gc.get_objects() if issubclass(type(o), DataLoader)]  # no __class__


def one_batch(loader) -> object:
    """A batch of the loader's own making, in this process: its sampler's first indices through
    its data set and collate_fn (as a worker would), or an iterable data set's first items."""
    from torch.utils.data import IterableDataset

    if isinstance(loader.dataset, IterableDataset):
        items = iter(loader.dataset)
        if loader.batch_size is None:
            return loader.collate_fn(next(items))
        return loader.collate_fn([next(items) for _ in range(loader.batch_size)])
    if loader.batch_sampler is None:
        return loader.collate_fn(loader.dataset[next(iter(loader.sampler))])
    return loader.collate_fn([loader.dataset[i] for i in next(iter(loader.batch_sampler))])


def _tensors(obj: object) -> list:
    """The tensors in a batch (a tensor, or mappings, lists and tuples of them)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if isinstance(obj, list | tuple):
        return [t for o in obj for t in _tensors(o)]
    return []


def _shared(obj: object) -> object:
    """`obj` with each tensor's like in shared memory, where a worker's collate writes a batch
    (the copy of the samples into it is the loading's, in the data wait already: not made)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return torch.empty_like(obj).share_memory_()
    if isinstance(obj, Mapping):
        return {k: _shared(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        out = [_shared(o) for o in obj]
        return out if isinstance(obj, list) else tuple(out)
    return obj


def _touch(obj: object) -> None:
    """Read a page of each tensor's every page: a batch from a worker is mapped, not yet read."""
    for t in _tensors(obj):
        if t.is_contiguous() and t.numel():
            float(t.reshape(-1)[:: max(1, 4096 // t.element_size())].sum())


def _send(conn, batch: object, n: int) -> None:
    """A stand-in worker (forked): n batches into shared memory and through the pipe, pickled
    as a torch.multiprocessing queue pickles them; its seconds per batch back at the end."""
    from multiprocessing.reduction import ForkingPickler  # torch's reductions registered

    import torch

    torch.set_num_threads(1)  # as a DataLoader worker runs
    spent = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.send_bytes(bytes(ForkingPickler.dumps(_shared(batch))))
        spent.append(time.perf_counter() - t0)
    conn.send(spent)
    conn.recv()  # the main process has rebuilt every batch: the shared memory may go


def handover(batch: object, timeout: float = 5.0) -> dict | None:
    """What handing `batch` over from a DataLoader worker costs: the worker's seconds (the batch
    written to shared memory, pickled) and the main process's (unpickled, its shared memory
    mapped and read), each the median of a few batches, through the mechanism the workers use
    (torch.multiprocessing's pickler, a pipe, file descriptors). None where it cannot be
    measured here (no fork: a spawned stand-in would spend seconds importing torch)."""
    from multiprocessing.reduction import ForkingPickler  # torch's reductions registered

    import torch.multiprocessing as tmp

    tensors = _tensors(batch)
    size = sum(t.numel() * t.element_size() for t in tensors)
    if "fork" not in tmp.get_all_start_methods() or any(t.device.type != "cpu" for t in tensors):
        return None
    n = max(1, min(HANDOVER_BATCHES, HANDOVER_BYTES // max(1, size)))
    ctx = tmp.get_context("fork")
    here, there = ctx.Pipe()
    p = ctx.Process(target=_send, args=(there, batch, n), daemon=True)
    p.start()
    got = []
    try:
        for _ in range(n):
            if not here.poll(timeout):
                return None
            raw = here.recv_bytes()
            t0 = time.perf_counter()
            _touch(ForkingPickler.loads(raw))
            got.append(time.perf_counter() - t0)
        if not here.poll(timeout):
            return None
        sent = here.recv()
        here.send(True)
    finally:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
    return {
        "batch_bytes": size,
        "handover_main_s": statistics.median(got),
        "handover_worker_s": statistics.median(sent),
    }


def measure_price(clock: CpuClock) -> dict:
    """What the price of workers needs beside the report: the timed window's CPU use, and for
    the script's DataLoader one batch loaded here (its CPU seconds over its wall seconds: how
    much of the data wait is work a worker needs a core for) and handed over. {"why": ...}
    where something could not be measured."""
    out = dict(clock.result or {})
    loaders = _loaders()
    if not loaders:
        return {
            **out,
            "why": "no DataLoader found in the script's process (one built in the for "
            "statement itself is held by its iterator alone, which the doctor does not open)",
        }
    try:
        loads, wall0, cpu0 = [], time.perf_counter(), time.process_time()
        while len(loads) < LOAD_BATCHES and time.perf_counter() - wall0 < LOAD_SECONDS:
            loads.append(one_batch(loaders[0]))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        out["load_cpu_share"] = cpu / wall if wall > 0 else None
        moved = handover(loads[-1])
    except Exception as e:  # the learner's data set may raise anything
        return {**out, "why": f"a batch could not be loaded and handed over here ({e!r})"}
    if moved is None:
        return {
            **out,
            "why": "the hand-over could not be timed here (no fork start method, or a batch "
            "already on the device)",
        }
    return {**out, **moved, **_pinning(loads[-1])}


def _pinning(batch: object) -> dict:
    """On CUDA, the seconds the pin_memory thread spends copying a batch to page-locked memory
    (the second of two: the first allocates what the pinned-memory cache then reuses)."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    for _ in range(2):
        t0 = time.perf_counter()
        for t in _tensors(batch):
            t.pin_memory()
        spent = time.perf_counter() - t0
    return {"pin_s": spent}


# How `price_workers` prices the step:
# - the data wait `wait_s` is the main process loading (with no workers); `load_cpu_share`
#   of it is CPU work (a batch loaded here: CPU seconds over wall seconds; sleeps and reads
#   are not), which a worker needs a core for; a worker runs one intra-op thread, so a batch
#   takes it the longer of the wait and that CPU time, plus writing the batch to shared
#   memory (`handover_worker_s`);
# - the rest of the step is compute, on `main_cores` busy cores over the step (measured)
#   less the loading's, plus receiving each batch (`handover_main_s`);
# - the step becomes the slower of the two sides: compute plus receiving, or a worker's
#   batch over `workers` (they load in turn, each its own batch);
# - the cores: the workers' CPU and the main process's over that step must fit on the cores
#   other processes left free (`cores - others_cores`), else they would take turns on them
#   and the step is not predicted ("cannot be predicted here", with the numbers);
# - a predicted step no shorter than the step now: the hand-over (or the compute) eats the
#   gain, and the prediction is <= 1x, said as such.
def price_workers(
    *,
    step_s: float,
    wait_s: float,
    workers: int,
    cores: int,
    main_cores: float,
    others_cores: float,
    load_cpu_share: float,
    handover_main_s: float,
    handover_worker_s: float,
) -> dict:
    """The step with `workers` DataLoader workers, priced from what was measured with none
    (a pure function: every term is an argument; the pricing is in the comment above).
    {"predicted_speedup": x or None, "why": the words, and the terms}."""
    step_s, wait_s = float(step_s), min(float(wait_s), float(step_s))
    compute = max(step_s - wait_s, 1e-9)
    load_cpu = max(0.0, load_cpu_share) * wait_s
    compute_cores = min(float(cores), max(0.0, (main_cores * step_s - load_cpu) / compute))
    batch = max(wait_s, load_cpu) + handover_worker_s  # one worker, one batch
    main = compute + handover_main_s
    cpu = load_cpu + handover_worker_s + compute_cores * compute + handover_main_s  # a batch's

    def priced(k: int) -> tuple[float, float]:  # k workers: the step, the cores it keeps busy
        step = max(main, batch / k)
        return step, cpu / step

    new_step, need = priced(workers)
    free = cores - others_cores
    terms = {
        "compute_s": compute,
        "compute_cores": compute_cores,
        "worker_batch_s": batch,
        "step_s_priced": new_step,
        "cores_needed": need,
        "cores_free": free,
    }
    if need > free:
        batch_cpu = load_cpu + handover_worker_s
        return _refusal(workers, batch, batch_cpu, terms, cores, others_cores, priced, step_s)
    speedup = step_s / new_step
    why = _priced_words(step_s, new_step, main, batch, workers, handover_worker_s, handover_main_s)
    why += f"; {need:.2f} of {free:.2f} free cores"
    if speedup <= 1.0:
        why = "no gain: the hand-over and the compute eat it; " + why
    return {"predicted_speedup": speedup, "why": why, **terms}


def _priced_words(
    step_s: float,
    new_step: float,
    main: float,
    batch: float,
    workers: int,
    handover_worker_s: float,
    handover_main_s: float,
) -> str:
    """`price_workers`' words for a priced step: what sets it, and the hand-over's cost."""
    side = (
        f"the main process's compute and receiving ({1e3 * main:.1f} ms a batch)"
        if main >= batch / workers
        else f"{workers} workers' loading ({1e3 * batch:.1f} ms a batch each)"
    )
    return (
        f"step {1e3 * step_s:.1f} -> {1e3 * new_step:.1f} ms, set by {side}; hand-over "
        f"{1e3 * handover_worker_s:.2f} ms in a worker + {1e3 * handover_main_s:.2f} ms in the "
        f"main process a batch"
    )


def _refusal(
    workers: int,
    batch: float,
    batch_cpu: float,
    terms: dict,
    cores: int,
    others: float,
    priced: Callable[[int], tuple[float, float]],
    step_s: float,
) -> dict:
    """`price_workers`' answer when the workers and the main process would not fit the cores:
    no prediction, the numbers, and the most workers short of these that would fit."""
    why = (
        f"cannot be predicted here: {workers} workers loading ({1e3 * batch:.1f} ms a batch, "
        f"{1e3 * batch_cpu:.1f} ms of it CPU) beside the main process computing on "
        f"{terms['compute_cores']:.2f} busy cores would need {terms['cores_needed']:.2f} cores, "
        f"and {terms['cores_free']:.2f} of the {cores} usable are free (other processes keep "
        f"{others:.2f} busy): they would take turns on the cores"
    )
    free = terms["cores_free"]
    fits = next((k for k in range(workers - 1, 0, -1) if priced(k)[1] <= free), None)
    if fits is not None:  # fewer workers that fit: priced, not re-run
        gain = step_s / priced(fits)[0]
        why += f"; {fits} worker{'s' * (fits > 1)} would fit, priced {gain:.2f}x"
        terms["workers_that_fit"] = fits
    return {"predicted_speedup": None, "why": why, **terms}
