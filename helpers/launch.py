"""Start N ranks of a notebook's script on this machine, stream their output, always end them.

With torchrun's variables and INIT_METHOD=file://<a new folder>/rendezvous: no rendezvous server
listens (a TCPStore listens on every interface, whatever host it is given); gloo/NCCL bind to
loopback. The whole tree ends on a failure, the deadline, Ctrl-C or (Linux) a dead kernel."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from . import paths, processes
from .checks import check_int, check_seconds

KEEP_RUNS = 20


class LaunchError(RuntimeError):
    """A rank failed or the run timed out. `failed_rank`, `traceback` and `outputs` say what."""

    def __init__(
        self,
        message: str,
        *,
        failed_rank: int | None,
        traceback: str,
        outputs: dict[int, list[str]],
        pids: list[int],
        stop_seconds: float,
    ) -> None:
        super().__init__(message)  # stop_seconds: from the failure to every process gone
        self.failed_rank, self.traceback, self.outputs, self.pids = (
            failed_rank,
            traceback,
            outputs,
            pids,
        )
        self.stop_seconds = stop_seconds


@dataclass
class RunResult:
    """A finished run: each rank's output lines and `rank<r>.json` (if it wrote one)."""

    nprocs: int
    seconds: float
    folder: Path
    outputs: dict[int, list[str]]
    pids: list[int] = field(default_factory=list)

    @functools.cached_property  # read once: the ranks have ended; a run's files can be MBs
    def results(self) -> dict[int, dict[str, Any]]:
        found = (json.loads(p.read_text()) for p in self.folder.glob("rank*.json"))
        return dict(sorted((int(r["rank"]), r) for r in found))


def run_folder(name: str) -> Path:
    """A new folder `<build>/ddp_runs/<name>_*` for one notebook run's scripts and outputs (two
    runs at once never share one); only the newest KEEP_RUNS are kept."""
    root = paths.build_dir() / "ddp_runs"
    root.mkdir(parents=True, exist_ok=True)
    old = []
    for p in root.iterdir():
        with contextlib.suppress(OSError):  # a run beside this one may have pruned it first
            old.append((p.stat().st_mtime, p))
    for _, p in sorted(old)[: max(0, len(old) - KEEP_RUNS + 1)]:
        shutil.rmtree(p, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}_", dir=root))


def run(
    script: str | Path,
    args: list[Any] | tuple[Any, ...] = (),
    *,
    nprocs: int = 2,
    threads: int = 1,
    timeout: float = 300,
    stream: bool = True,
) -> RunResult:
    """Run `python script *args` in `nprocs` ranks, working in a new folder beside the script;
    raise `LaunchError` naming the rank that failed first, or at the deadline; none is left."""
    script = Path(script).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"run: script {str(script)!r} is not a file")
    check_int("nprocs", nprocs, 1, where="run")
    check_int("threads", threads, 1, where="run")
    check_seconds("timeout", timeout, where="run")
    folder = Path(tempfile.mkdtemp(prefix=f"{script.stem}_{nprocs}ranks_", dir=script.parent))
    env = _ranks_env(folder, nprocs, threads)
    q, procs, t0, outputs = queue.Queue(), [], time.monotonic(), {r: [] for r in range(nprocs)}
    try:
        for r in range(nprocs):
            p = subprocess.Popen(
                processes.dies_with_parent([sys.executable, str(script), *map(str, args)]),
                env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                cwd=folder,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            procs.append(p)
            threading.Thread(target=_follow, args=(r, p, q), daemon=True).start()
        failed, when = _watch(q, outputs, nprocs, t0 + timeout, stream)
    finally:
        pids = sorted(
            {*processes.end_tree([p.pid for p in procs], grace=3.0), *(p.pid for p in procs)}
        )
        # FileStore's last rank removes it, unless it died first
        (folder / "rendezvous").unlink(missing_ok=True)
        gone = time.monotonic()
    if failed is None and when is None:
        return RunResult(nprocs, gone - t0, folder, outputs, pids)
    raise _launch_error(
        failed,
        procs,
        nprocs,
        timeout,
        outputs=outputs,
        pids=pids,
        stop_seconds=gone - (when or gone),
    )


def _ranks_env(folder: Path, nprocs: int, threads: int) -> dict[str, str]:
    """The environment every rank of a `run` in `folder` shares (`run` adds RANK, LOCAL_RANK):
    torchrun's variables, a new rendezvous file, `threads` OpenMP threads, loopback for
    gloo/NCCL."""
    lo = next(
        (
            name
            for name, addrs in psutil.net_if_addrs().items()  # lo on Linux, lo0 on macOS
            if any(a.address == "127.0.0.1" for a in addrs)
        ),
        "lo",
    )
    return {
        **os.environ,
        "WORLD_SIZE": str(nprocs),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "PYTHONUNBUFFERED": "1",
        "INIT_METHOD": (folder / "rendezvous").as_uri(),  # a new file for every launch
        "OMP_NUM_THREADS": str(threads),
        "GLOO_SOCKET_IFNAME": lo,
        "NCCL_SOCKET_IFNAME": lo,
    }


def _launch_error(
    failed: int | None,
    procs: list[subprocess.Popen],
    nprocs: int,
    timeout: float,
    *,
    outputs: dict[int, list[str]],
    pids: list[int],
    stop_seconds: float,
) -> LaunchError:
    """What `run` raises when rank `failed` failed first, or at the deadline (`failed` None)."""
    tb = _traceback(outputs[failed]) if failed is not None else ""
    msg = (
        f"rank {failed} failed (exit code {procs[failed].returncode})"
        if failed is not None
        else f"run timed out after {timeout:g} s"
    ) + f"; all {nprocs} ranks were stopped"
    return LaunchError(
        msg + (f"\n--- traceback of rank {failed} ---\n{tb}" if tb else ""),
        failed_rank=failed,
        traceback=tb,
        outputs=outputs,
        pids=pids,
        stop_seconds=stop_seconds,
    )


def _follow(rank: int, p: subprocess.Popen, q: queue.Queue) -> None:
    """Each line of a rank's output, then its exit code and when it ended."""
    for line in iter(p.stdout.readline, ""):
        q.put((rank, line.rstrip("\n"), None))
    p.stdout.close()
    q.put((rank, None, (p.wait(), time.monotonic())))


def _watch(
    q: queue.Queue, outputs: dict[int, list[str]], nprocs: int, deadline: float, stream: bool
) -> tuple[int | None, float | None]:
    """Show lines until every rank ended well (None, None), one failed (rank, when) or time is
    up (None, now). The first rank to exit with an error is the cause: the others fail after it."""
    done = 0
    while done < nprocs and time.monotonic() < deadline:
        try:
            rank, line, end = q.get(timeout=0.1)  # short: the deadline and Ctrl-C are seen soon
        except queue.Empty:
            continue
        if line is not None:
            outputs[rank].append(line)
            if stream:
                print(f"[rank {rank}] {line}", flush=True)
        elif end[0] != 0:
            return rank, end[1]
        else:
            done += 1
    return None, None if done == nprocs else time.monotonic()


def _traceback(lines: list[str]) -> str:  # torch prefixes a rank's traceback: "[rank<r>]: "
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    return "\n".join(lines[starts[-1] :] if starts else lines[-20:])
