"""How much memory do DataLoader workers really take? Measure it while they load.

    with WorkerMemorySampler() as mem:
        consume(loader)
    mem.summary()   # peak number of workers, their peak resident (RSS) and unique (USS) memory

Resident memory (RSS) counts pages a worker shares with its parent: with the `fork` start
method every worker starts as a copy-on-write clone of the notebook's process, so RSS
overstates what the workers add. Unique memory (USS, Linux / macOS / Windows through psutil)
is what the machine would get back if the worker exited: that is the honest cost.

`live_workers()` lists the child processes still alive (resource trackers excluded): after a
loader is done with, it should be empty.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psutil

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
        if not isinstance(self.interval, (int, float)) or self.interval <= 0:
            raise ValueError(f"WorkerMemorySampler: interval must be > 0 seconds, got {self.interval!r}")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._me = psutil.Process()

    def _sample(self) -> None:
        rss = uss = 0
        n = 0
        for w in live_workers():
            try:
                if self.unique:
                    info = w.memory_full_info()
                    uss += info.uss
                else:
                    info = w.memory_info()
                rss += info.rss
                n += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.samples.append({"t": time.perf_counter(), "workers": n, "rss": rss, "uss": uss,
                             "parent_rss": self._me.memory_info().rss})

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> WorkerMemorySampler:
        self.samples.clear()
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
                    "rss_per_worker_mb": 0.0, "uss_per_worker_mb": 0.0,
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
        }


def batch_megabytes(batch_size: int, shape: tuple[int, ...], bytes_per_value: int = 4) -> float:
    """Size of one batch of `shape`-sized samples (float32 by default), in MB."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    n = batch_size * bytes_per_value
    for s in shape:
        n *= s
    return n / MB


def claimed_worker_megabytes(batch_mb: float, num_workers: int, prefetch_factor: int = 2) -> float:
    """Claim L2's arithmetic, made exact for PyTorch: each worker keeps up to `prefetch_factor`
    finished batches in flight, so the batches alone need workers x prefetch x batch size."""
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
    return batch_mb * num_workers * prefetch_factor
