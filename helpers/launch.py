"""Start `torch.distributed` workers from a notebook through `torchrun`, and always clean them up.

`launch("helpers.ddp_train", ["--steps-per-epoch", "10"], nprocs=2)` runs one torchrun agent,
`torchrun --nnodes=1 --nproc-per-node=2 --max-restarts=0 ... -m helpers.ddp_train ...`, which
starts the 2 workers with their environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) and, when one
fails, stops the others and reports the first failure's traceback (the workers' `main` is wrapped
in `@record`). `nprocs=[2, 1]` runs two agents ("nodes") on this machine that meet at one c10d
rendezvous, as on two machines. The launch returns what each rank wrote as JSON (`--out DIR`).

What stays ours, because torchrun lacks it: a wall-clock deadline (a hung collective must never
hang the notebook), the ranks' output streamed into the notebook with their rank, every process
(agents and workers) ended on failure, timeout or Ctrl-C, and a rendezvous on loopback only
(stock torchrun's stores listen on every interface). `mp.spawn` in the notebook is no way out:
functions defined in a notebook cannot be pickled into fresh processes.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import torch.distributed as dist

from . import paths, process_group, processes
from .checks import check_int, check_seconds

REPO_ROOT = Path(__file__).resolve().parents[1]
KEEP_RUNS = 20
# torchrun's prefix for a worker's line (set below), and torch's own on an uncaught exception
_RANK_LINE = re.compile(r"\[rank (\d+)\] (?:\[rank\1\]: )?(.*)")


class LaunchError(RuntimeError):
    """A worker failed or the run timed out. `failed_rank`, `traceback` and `outputs` say what."""

    def __init__(self, message: str, *, failed_rank: int | None, traceback: str,
                 outputs: dict[str, list[str]], pids: list[int],
                 stop_seconds: float = float("nan")) -> None:
        super().__init__(message)
        self.failed_rank = failed_rank
        self.traceback = traceback
        self.outputs = outputs
        self.pids = pids
        self.stop_seconds = stop_seconds  # from the first failure to every process gone


@dataclass
class LaunchResult:
    """What a successful run left: per-rank JSON results, output lines, timings, the port used."""

    nprocs: int
    backend: str
    port: int
    seconds: float
    results: dict[int, dict[str, Any]]
    outputs: dict[str, list[str]]  # "rank 0": its lines; "node 0": its torchrun agent's own
    pids: list[int] = field(default_factory=list)  # agents and workers
    out_dir: str = ""

    def rank(self, r: int) -> dict[str, Any]:
        if r not in self.results:
            raise KeyError(f"rank {r} wrote no result; ranks with results: {sorted(self.results)}")
        return self.results[r]


def bound_store(host: str, world_size: int, timeout: float, *, port: int = 0,
                multi_tenant: bool = False) -> dist.TCPStore:
    """A `TCPStore` server that listens on `host` only (127.0.0.1: this machine only).

    PyTorch's TCPStore server listens on every interface whatever host it is given (checked
    with `ss -ltnp`: `*:port` for `TCPStore("127.0.0.1", ...)`), and anyone who can reach the
    port can set keys. Given a socket already bound and listening (`master_listen_fd`), it
    uses that one instead."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
        sock.listen(1024)
        bound_port = sock.getsockname()[1]
        fd = sock.detach()  # the store owns the socket from here and closes it
    except BaseException:
        sock.close()
        raise
    return dist.TCPStore(host, bound_port, world_size, True, timedelta(seconds=timeout),
                         wait_for_workers=False, multi_tenant=multi_tenant,
                         master_listen_fd=fd, use_libuv=True)


def _env(threads: int, host: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads))
    env.setdefault("LOGLEVEL", "WARNING")  # torchrun's agent: warnings and errors only
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPLBACKEND", "Agg")
    if host in ("127.0.0.1", "localhost", "::1"):  # the ranks' own (gloo, nccl) sockets too
        env.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
    return env


def launch(module: str = "helpers.ddp_train", args: list[Any] | tuple[Any, ...] = (), *,
           nprocs: int | list[int] = 2, backend: str = "auto", threads: int = 1,
           timeout: float = 120, init_timeout: float = 30, host: str = "127.0.0.1",
           stream: bool = True, out_dir: str | Path | None = None) -> LaunchResult:
    """Run `python -m <module> <args> --backend B --threads T --out DIR --init-timeout S` in
    `nprocs` processes under torchrun, and collect each rank's `rank<r>.json` from DIR.

    `nprocs`: processes on this machine (one torchrun agent), or a list, one count per "node"
    (one agent each, all on this machine, meeting at one c10d rendezvous on `host`).
    `threads`: intra-op threads per process. `timeout`: deadline for the whole run;
    `init_timeout`: for `init_process_group`. Raises `LaunchError` (with the rank that failed
    first and its traceback) when a rank fails or time runs out; every process is gone by then.
    """
    if not isinstance(module, str) or not module:
        raise ValueError(f"launch: module must be a dotted module name such as "
                         f"'helpers.ddp_train', got {module!r}")
    per_node = list(nprocs) if isinstance(nprocs, list | tuple) else [nprocs]
    if not per_node:
        raise ValueError("launch: nprocs must be an int >= 1 or a list of them, got []")
    for n in per_node:
        check_int("nprocs", n, 1, where="launch")
    check_int("threads", threads, 1, where="launch")
    check_seconds("timeout", timeout, where="launch")
    check_seconds("init_timeout", init_timeout, where="launch")
    # the nodes share this machine's GPUs; each worker applies the same rule to its own node
    backend = process_group.resolve_backend(backend, sum(per_node))
    # This process hosts the c10d rendezvous store, listening on `host` only; the agents join it
    # as clients (is_host=0), and the first one's store for the workers is bound the same way.
    store = bound_store(host, 1, timeout, multi_tenant=True)
    port = store.port
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="ddp_", dir=_runs_dir()))
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "torchrun"  # torchrun's per-worker logs and error files
    worker_args = [*map(str, args), "--backend", backend, "--threads", str(threads),
                   "--out", str(out), "--init-timeout", str(init_timeout)]
    ours = ["--rdzv-conf=is_host=0", f"--local-addr={host}", "--tee=3", f"--log-dir={logs}"]
    cmds = [torchrun_command(module, worker_args, nnodes=len(per_node), nproc_per_node=n,
                             endpoint=f"{host}:{port}", rdzv_id=f"ftg{port}",
                             python=sys.executable, runner="helpers.launch", options=ours)
            for n in per_node]
    gpus = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")
    envs, first_gpu = [], 0
    for n in per_node:
        env = _env(threads, host)
        # the ranks' output prefix; the environment, not --log-line-prefix-template: that flag
        # is newer than the oldest torch this suite supports
        env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[rank ${rank}] "
        if backend == "nccl" and len(per_node) > 1:  # "nodes" on one machine: a GPU each
            env["CUDA_VISIBLE_DEVICES"] = ",".join(
                gpus[g] if gpus[0] else str(g) for g in range(first_gpu, first_gpu + n))
            first_gpu += n
        envs.append(env)
    if stream:
        print(f"[launch] {sum(per_node)} process(es) on {len(per_node)} torchrun node(s) "
              f"{per_node}, backend={backend}, {threads} thread(s) each, "
              f"c10d rendezvous {host}:{port}")
        for i, cmd in enumerate(cmds):
            print(f"[launch] node {i} runs: " + shlex.join(["torchrun", *cmd[3:]]).replace(str(out), "<out>"))
    t0 = time.perf_counter()
    try:
        outputs, pids = run_processes(cmds, envs, timeout=timeout, stream=stream,
                                      labels=[f"node {i}" for i in range(len(per_node))],
                                      first_error=lambda lines: _first_error(logs, f"ftg{port}", lines))
    finally:
        del store  # closes the rendezvous server once every process is gone
    return LaunchResult(nprocs=sum(per_node), backend=backend, port=port,
                        seconds=time.perf_counter() - t0, results=read_results(out),
                        outputs=outputs, pids=pids, out_dir=str(out))


def torchrun_command(module: str, args: list[Any] | tuple[Any, ...], *, nnodes: int,
                     nproc_per_node: int, endpoint: str, rdzv_id: str,
                     python: str = "python", runner: str = "torch.distributed.run",
                     options: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The `torchrun` command one node runs to join a c10d rendezvous at `endpoint`."""
    return [python, "-m", runner, f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}", "--max-restarts=0",
            *options, "-m", module, *map(str, args)]


def torchrun_bound(argv: list[str] | None = None) -> None:
    """`torchrun`, with the store server its first node starts for the workers listening on
    `--local-addr` only (stock torchrun's listens on every interface, as any TCPStore does).
    Run as `python -m helpers.launch <torchrun arguments>`."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.run import main

    def create_server(self: Any, master_addr: str, master_port: int) -> dist.TCPStore:
        return bound_store(master_addr, 1, 300, port=master_port, multi_tenant=True)

    dynamic_rendezvous.DynamicRendezvousHandler._create_tcp_store_server = create_server
    main(argv)
    process_group.exit_rank(0)  # done: skip the interpreter's teardown of torch (a second, loaded)


def _first_error(logs: Path, run_id: str,
                 outputs: dict[str, list[str]]) -> tuple[int | None, str, float | None]:
    """The rank that failed first, its traceback and when (time.time()), from torchrun's error
    files (one per failed worker, written by `@record`, with the rank and exact time
    `process_group.record` adds): the root cause, not the ranks that failed afterwards because
    their peer vanished. A worker that died without an exception (a signal, `os._exit`) leaves
    none: its agent's report names it."""
    errs = []
    for p in logs.glob(f"{run_id}_*/attempt_*/*/error.json"):  # this run's, in torchrun's layout
        try:
            info = json.loads(p.read_text())["message"]["extraInfo"]
            errs.append((float(info.get("time", info["timestamp"])), int(info.get("rank", -1)),
                         info["py_callstack"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if errs:
        when, rank, tb = min(errs)
        return rank, tb, when
    for label, lines in outputs.items():  # torchrun's ChildFailedError: "Root Cause ... rank: N"
        text = "\n".join(lines)
        if label.startswith("node") and "Root Cause" in text:
            root = text[text.index("Root Cause"):]
            m = re.search(r"rank\s*:\s*(\d+)", root)
            return (int(m[1]) if m else None), root, None
    return None, "", None


def read_results(out: str | Path) -> dict[int, dict[str, Any]]:
    """Each rank's `rank<r>.json` from a run's output folder."""
    res = {}
    for p in Path(out).glob("rank*.json"):
        data = json.loads(p.read_text())
        res[int(data["rank"])] = data
    return dict(sorted(res.items()))


def _runs_dir() -> Path:
    """`build/ddp_runs`, keeping only the newest KEEP_RUNS run folders (checkpoints add up)."""
    d = paths.build_dir() / "ddp_runs"
    d.mkdir(parents=True, exist_ok=True)
    runs = []
    for p in d.iterdir():
        try:  # a launch running beside this one may prune the same folder first
            if p.is_dir():
                runs.append((p.stat().st_mtime, p))
        except FileNotFoundError:
            continue
    for _, old in sorted(runs)[:-KEEP_RUNS]:
        shutil.rmtree(old, ignore_errors=True)
    return d


def _reader(idx: int, pipe: Any, q: queue.Queue) -> None:
    for line in iter(pipe.readline, ""):
        q.put((idx, line.rstrip("\n")))
    pipe.close()
    q.put((idx, None))


def _tree(procs: list[subprocess.Popen]) -> list[psutil.Process]:
    """The processes and all their descendants now (torchrun starts each worker in a session of
    its own, so a signal to the agent's process group would not reach them)."""
    tree = []
    for p in procs:
        try:
            root = psutil.Process(p.pid)
            tree += [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
    return tree


def _tail_traceback(lines: list[str]) -> str:
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback"):
            return "\n".join(lines[i:])
    return "\n".join(lines[-20:])


def run_processes(cmds: list[list[str]], envs: list[dict[str, str]], *, timeout: float,
                  stream: bool = True, labels: list[str] | None = None,
                  first_error: Callable[[dict[str, list[str]]], tuple[int | None, str, float | None]]
                  | None = None) -> tuple[dict[str, list[str]], list[int]]:
    """Run the commands together; stream their merged stdout/stderr line by line: a line that
    torchrun prefixed with `[rank N] ` is filed under "rank N" and shown, others are filed under
    the command's label (torchrun's own log) and shown only until a rank has spoken. Return
    (output lines, pids of every process seen). On the first failure, at the deadline or on
    Ctrl-C, stop every process and raise `LaunchError`, naming the rank `first_error(outputs)`
    finds (rank, traceback, time; else the failed command)."""
    if len(cmds) != len(envs):
        raise ValueError("run_processes: cmds and envs must have the same length")
    labels = labels or [str(i) for i in range(len(cmds))]
    q: queue.Queue = queue.Queue()
    procs: list[subprocess.Popen] = []
    outputs: dict[str, list[str]] = {}
    seen: set[int] = set()
    open_pipes = len(cmds)
    failed: int | None = None
    timed_out = False
    t_noticed = float("nan")

    def take(idx: int, line: str, show: bool) -> None:
        m = _RANK_LINE.match(line)
        key, text = (f"rank {m[1]}", m[2]) if m else (labels[idx], line)
        outputs.setdefault(key, []).append(text)
        if show and (m or not any(k.startswith("rank") for k in outputs)):
            print(f"[{key}] {text}", flush=True)

    try:
        for i, (cmd, env) in enumerate(zip(cmds, envs, strict=True)):
            # its own session, and a SIGTERM when this process dies: an agent (and so its
            # workers, which die with their agent) never outlives the kernel that launched it
            p = subprocess.Popen(cmd, env=env, cwd=str(REPO_ROOT), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, bufsize=1,
                                 start_new_session=True,
                                 preexec_fn=processes.parent_death_hook())
            procs.append(p)
            threading.Thread(target=_reader, args=(i, p.stdout, q), daemon=True).start()
        deadline = time.monotonic() + timeout
        next_look = 0.0
        while open_pipes or any(p.poll() is None for p in procs):
            try:
                idx, line = q.get(timeout=0.1)
                if line is None:
                    open_pipes -= 1
                else:
                    take(idx, line, stream)
            except queue.Empty:
                pass
            if time.monotonic() > next_look:  # note the workers' pids while they run
                seen.update(proc.pid for proc in _tree(procs))
                next_look = time.monotonic() + 0.5
            bad = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if bad:
                failed = bad[0]
                t_noticed = time.monotonic()
                break
            if time.monotonic() > deadline:
                timed_out = True
                t_noticed = time.monotonic()
                break
    finally:
        seen.update(proc.pid for proc in _tree(procs))
        processes.end_tree([p.pid for p in procs])
        for p in procs:
            p.wait()
        stop_seconds, gone = time.monotonic() - t_noticed, time.time()
        # drain what is left in the pipes so the traceback is complete
        end = time.monotonic() + 2
        while open_pipes and time.monotonic() < end:
            try:
                idx, line = q.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                open_pipes -= 1
            else:
                take(idx, line, stream and (failed is not None or timed_out))
    pids = sorted(seen | {p.pid for p in procs})
    if failed is None and not timed_out:
        return outputs, pids
    rank, tb, when = first_error(outputs) if first_error else (None, "", None)
    if when is not None:  # from the first failure (not from our noticing it) to every process gone
        stop_seconds = gone - when
    if rank is None and failed is not None:
        tb = tb or _tail_traceback(outputs.get(labels[failed], []))
    who = f"rank {rank}" if rank is not None else labels[failed] if failed is not None else None
    if timed_out:
        msg = (f"run timed out after {timeout:g} s; all {len(pids)} processes were stopped"
               + (f" ({who} had failed)" if rank is not None else ""))
    else:
        msg = (f"{who} failed (exit code {procs[failed].returncode} for {labels[failed]}); "
               f"all {len(pids)} processes were stopped")
    raise LaunchError(msg + (f"\n--- traceback of {who} ---\n{tb}" if tb else ""),
                      failed_rank=rank, traceback=tb, outputs=outputs, pids=pids,
                      stop_seconds=stop_seconds)


# --- the new launcher (file:// rendezvous, no torchrun store) ---------------------------------

@dataclass
class RunResult:
    """A finished run: each rank's output lines and `rank<r>.json` (if it wrote one)."""

    nprocs: int
    seconds: float
    folder: Path
    outputs: dict[int, list[str]]
    pids: list[int] = field(default_factory=list)

    @property
    def results(self) -> dict[int, dict[str, Any]]:
        found = (json.loads(p.read_text()) for p in self.folder.glob("rank*.json"))
        return dict(sorted((int(r["rank"]), r) for r in found))


def run_folder(name: str) -> Path:
    """A new folder `<build>/ddp_runs/<name>_*` for one notebook run's scripts and outputs (two
    runs at once never share one); only the newest KEEP_RUNS are kept."""
    root = paths.build_dir() / "ddp_runs"
    root.mkdir(parents=True, exist_ok=True)
    old = sorted((p.stat().st_mtime, p) for p in root.iterdir() if p.is_dir())
    for _, p in old[:max(0, len(old) - KEEP_RUNS + 1)]:
        shutil.rmtree(p, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}_", dir=root))


def _loopback() -> str:
    """The name of the interface that holds 127.0.0.1 ('lo' on Linux, 'lo0' on macOS)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addrs):
            return name
    return "lo"


def rank_env(rank: int, world: int, init_method: str, threads: int) -> dict[str, str]:
    """What a rank's process gets: torchrun's variables, the file rendezvous, loopback only."""
    lo = _loopback()
    return {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world), "INIT_METHOD": init_method, "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": str(threads), "GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo}


def run(script: str | Path, args: list[Any] | tuple[Any, ...] = (), *, nprocs: int = 2,
        threads: int = 1, timeout: float = 300, stream: bool = True) -> RunResult:
    """Run `python script *args` in `nprocs` ranks (cwd: the script's folder); raise
    `LaunchError` naming the rank that failed first, or at the deadline; no process is left."""
    script = Path(script).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"run: script {str(script)!r} is not a file")
    check_int("nprocs", nprocs, 1, where="run")
    check_int("threads", threads, 1, where="run")
    check_seconds("timeout", timeout, where="run")
    init = (script.parent / f"rendezvous-{uuid.uuid4().hex[:8]}").as_uri()
    q: queue.Queue = queue.Queue()
    procs: list[subprocess.Popen] = []
    outputs: dict[int, list[str]] = {r: [] for r in range(nprocs)}
    t0 = time.monotonic()
    try:
        for r in range(nprocs):
            p = subprocess.Popen([sys.executable, str(script), *map(str, args)],
                                 env=rank_env(r, nprocs, init, threads), cwd=script.parent,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True, preexec_fn=processes.parent_death_hook())
            procs.append(p)
            threading.Thread(target=_follow, args=(r, p, q), daemon=True).start()
        failed, when = _watch(q, outputs, nprocs, t0 + timeout, stream)
    finally:
        pids = [p.pid for p in procs]
        pids += [c.pid for p in procs if p.poll() is None for c in _children(p.pid)]
        processes.end_tree([p.pid for p in procs], grace=3.0)
        gone = time.monotonic()
    if failed is None and when is None:
        return RunResult(nprocs, gone - t0, script.parent, outputs, sorted(set(pids)))
    tb = _traceback(outputs[failed]) if failed is not None else ""
    msg = (f"rank {failed} failed (exit code {procs[failed].returncode})" if failed is not None
           else f"run timed out after {timeout:g} s") + f"; all {nprocs} ranks were stopped"
    raise LaunchError(msg + (f"\n--- traceback of rank {failed} ---\n{tb}" if tb else ""),
                      failed_rank=failed, traceback=tb, outputs=outputs,
                      pids=sorted(set(pids)), stop_seconds=gone - (when or gone))


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _follow(rank: int, p: subprocess.Popen, q: queue.Queue) -> None:
    """Each line of a rank's output, then its exit code and when it ended."""
    for line in iter(p.stdout.readline, ""):
        q.put((rank, line.rstrip("\n"), None))
    p.stdout.close()
    q.put((rank, None, (p.wait(), time.monotonic())))


def _watch(q: queue.Queue, outputs: dict[int, list[str]], nprocs: int, deadline: float,
           stream: bool) -> tuple[int | None, float | None]:
    """Show lines until every rank ended well (None, None), one failed (rank, when) or time is
    up (None, now). The first rank to exit with an error is the cause: the others fail after it."""
    done = 0
    while done < nprocs:
        try:
            rank, line, end = q.get(timeout=max(0.0, min(0.1, deadline - time.monotonic())))
        except queue.Empty:
            if time.monotonic() >= deadline:
                return None, time.monotonic()
            continue
        if line is not None:
            outputs[rank].append(line)
            if stream:
                print(f"[rank {rank}] {line}", flush=True)
        elif end[0] != 0:
            return rank, end[1]
        else:
            done += 1
    return None, None


def _traceback(lines: list[str]) -> str:
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    return "\n".join(lines[starts[-1]:] if starts else lines[-20:])


if __name__ == "__main__":  # python -m helpers.launch <torchrun arguments>: see torchrun_bound
    torchrun_bound()
