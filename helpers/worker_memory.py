"""How much memory do DataLoader workers really take? Measure it while they load.

    with WorkerMemorySampler() as mem:
        consume(loader)
    mem.summary()   # peak number of workers, their peak resident (RSS) and unique (USS) memory

Resident memory (RSS) counts pages a worker shares with its parent: with the `fork` start
method every worker starts as a copy-on-write clone of the notebook's process, so RSS
overstates what the workers add. Unique memory (USS, Linux / macOS / Windows through psutil)
is what the machine would get back if the worker exited. Batches in flight live in shared
memory, mapped by a worker and then by the parent, so neither RSS nor USS of the workers alone
sees them reliably; proportional memory (PSS: shared pages split between the processes that map
them) of anonymous and shared-memory pages, summed over the parent *and* its workers, does. `added_mb` is that sum (median while loading)
minus the parent's PSS before loading: the physical memory that loading with workers added.

`live_workers()` lists the child processes still alive (resource trackers excluded): after a
loader is done with, it should be empty.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

import psutil

from .checks import check_int, check_seconds

MB = 2**20
_NOT_WORKERS = ("resource_tracker", "forkserver", "semaphore_tracker")


def live_workers(pid: int | None = None) -> list[psutil.Process]:
    """Child processes of `pid` (default: this process) that are alive, excluding the helper
    processes multiprocessing keeps for itself (resource tracker, forkserver)."""
    try:
        parent = psutil.Process(pid)
        kids = parent.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            if k.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(k.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(s in cmd for s in _NOT_WORKERS):
            continue
        out.append(k)
    return out


@dataclass
class WorkerMemorySampler:
    """Sample the memory of this process's workers from a background thread every `interval` s."""

    interval: float = 0.05
    unique: bool = True  # also read USS (costs a read of /proc/<pid>/smaps per worker)
    samples: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_seconds("interval", self.interval, where="WorkerMemorySampler")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._me = psutil.Process()

    def _pss(self, proc: psutil.Process) -> tuple[int, int, int]:
        """(rss, uss, private pss) of `proc`: see `private_pss`."""
        if not self.unique:
            rss = proc.memory_info().rss
            return rss, 0, 0
        info = proc.memory_full_info()
        return info.rss, info.uss, private_pss(proc.pid, fallback=getattr(info, "pss", info.uss))

    def _sample(self) -> None:
        rss = uss = pss = 0
        n = 0
        for w in live_workers():
            try:
                r, u, p = self._pss(w)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            rss, uss, pss, n = rss + r, uss + u, pss + p, n + 1
        parent_rss, _, parent_pss = self._pss(self._me)
        self.samples.append({"t": time.perf_counter(), "workers": n, "rss": rss, "uss": uss,
                             "pss": pss, "parent_rss": parent_rss, "parent_pss": parent_pss})

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> WorkerMemorySampler:
        self.samples.clear()
        self.baseline_pss = self._pss(self._me)[2]  # the parent alone, before loading
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name="worker-memory")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> dict[str, float]:
        """Peaks over the run, in MB: all workers together and per worker (at the peak)."""
        busy = [s for s in self.samples if s["workers"]]
        if not busy:
            return {"workers": 0, "samples": len(self.samples), "rss_mb": 0.0, "uss_mb": 0.0,
                    "rss_per_worker_mb": 0.0, "uss_per_worker_mb": 0.0, "added_mb": 0.0,
                    "parent_rss_mb": max((s["parent_rss"] for s in self.samples), default=0) / MB}
        top_rss = max(busy, key=lambda s: s["rss"])
        top_uss = max(busy, key=lambda s: s["uss"])
        return {
            "workers": max(s["workers"] for s in busy),
            "samples": len(self.samples),
            "rss_mb": top_rss["rss"] / MB,
            "uss_mb": top_uss["uss"] / MB,
            "rss_per_worker_mb": top_rss["rss"] / top_rss["workers"] / MB,
            "uss_per_worker_mb": top_uss["uss"] / top_uss["workers"] / MB,
            "parent_rss_mb": max(s["parent_rss"] for s in self.samples) / MB,
            # physical memory the loading added: parent + workers (private PSS), minus the parent
            # alone before it started; the median over the samples with every worker up, as a
            # sample taken while a worker starts or exits splits shared pages inconsistently
            "added_mb": (statistics.median(s["pss"] + s["parent_pss"] for s in busy
                                           if s["workers"] == max(b["workers"] for b in busy))
                         - self.baseline_pss) / MB,
        }


def private_pss(pid: int, fallback: int = 0) -> int:
    """Proportional memory of `pid` in anonymous and shared-memory pages (Linux smaps_rollup:
    Pss_Anon + Pss_Shmem), in bytes.

    Unlike plain PSS this leaves out file-backed pages (PyTorch's libraries), whose shares move
    whenever *any* process on the machine maps the same file; anonymous pages after `fork` and
    the shared-memory segments that carry batches are split only between the notebook's process
    and its workers, so summed over them they give the physical memory they use. Where
    smaps_rollup lacks these fields (older kernels, macOS, Windows) returns `fallback`.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return 1024 * sum(int(fields[k].split()[0]) for k in ("Pss_Anon", "Pss_Shmem"))
    except (OSError, KeyError, ValueError):
        return fallback


def batch_megabytes(batch_size: int, shape: tuple[int, ...], bytes_per_value: int = 4) -> float:
    """Size of one batch of `shape`-sized samples (float32 by default), in MB."""
    check_int("batch_size", batch_size, where="batch_megabytes")
    n = batch_size * bytes_per_value
    for s in shape:
        n *= s
    return n / MB


def claimed_worker_megabytes(batch_mb: float, num_workers: int, prefetch_factor: int = 2) -> float:
    """Claim L2's arithmetic, made exact for PyTorch: each worker keeps up to `prefetch_factor`
    finished batches in flight, so the batches alone need workers x prefetch x batch size."""
    check_int("num_workers", num_workers, 0, where="claimed_worker_megabytes")
    return batch_mb * num_workers * prefetch_factor
