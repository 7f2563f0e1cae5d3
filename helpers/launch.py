"""Start real `torch.distributed` worker processes from a notebook, and always clean them up.

`launch("helpers.ddp_train", ["--steps", "10"], nprocs=2)` starts 2 processes running
`python -m helpers.ddp_train` with the environment `torchrun` would give them (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT=<a free port>), streams their output into the
notebook prefixed with the rank, and returns what each rank wrote as JSON (`--out DIR`).
The same script runs unchanged under `torchrun`; `launch_torchrun_nodes` starts several
`torchrun` agents ("nodes") on this machine against one c10d rendezvous on loopback.

Why a helper and not `mp.spawn` in the notebook: functions defined in a notebook cannot be
pickled into fresh processes, and a hung collective must never hang the notebook. Here every
run has a deadline; when one rank fails or the deadline passes, every process group this helper
started is terminated (then killed), and the failing rank's traceback is raised.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from . import paths, processes

BACKENDS = ("auto", "gloo", "nccl")
REPO_ROOT = Path(__file__).resolve().parents[1]
_issued_ports: set[int] = set()
_port_lock = threading.Lock()


class LaunchError(RuntimeError):
    """A worker failed or the run timed out. `failed_rank`, `traceback` and `outputs` say what."""

    def __init__(self, message: str, *, failed_rank: int | None, traceback: str,
                 outputs: dict[int, list[str]], returncodes: dict[int, int | None],
                 pids: list[int], stop_seconds: float = float("nan")) -> None:
        super().__init__(message)
        self.stop_seconds = stop_seconds  # from noticing the failure to every process gone
        self.failed_rank = failed_rank
        self.traceback = traceback
        self.outputs = outputs
        self.returncodes = returncodes
        self.pids = pids


@dataclass
class LaunchResult:
    """What a successful run left: per-rank JSON results, output lines, timings, the port used."""

    nprocs: int
    backend: str
    port: int
    seconds: float
    results: dict[int, dict[str, Any]]
    outputs: dict[int, list[str]]
    returncodes: dict[int, int | None]
    pids: list[int] = field(default_factory=list)
    out_dir: str = ""

    def rank(self, r: int) -> dict[str, Any]:
        if r not in self.results:
            raise KeyError(f"rank {r} wrote no result; ranks with results: {sorted(self.results)}")
        return self.results[r]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now. The OS picks it (bind to port 0); ports already handed
    out by this process are never handed out again, so two runs started together differ."""
    with _port_lock:
        for _ in range(50):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _issued_ports:
                _issued_ports.add(port)
                return port
    raise RuntimeError("free_port: could not find an unused port after 50 tries")


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


def _loopback_env(host: str) -> dict[str, str]:
    """On loopback, the ranks' own sockets (gloo's and nccl's connections) use it too."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    return {}


def resolve_backend(backend: str, nprocs: int) -> str:
    """`auto` -> nccl when there is one GPU per process, else gloo; refuse impossible requests."""
    import torch

    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    gpus = torch.cuda.device_count()
    if backend == "auto":
        return "nccl" if gpus >= nprocs and torch.distributed.is_nccl_available() else "gloo"
    if backend == "nccl":
        if gpus == 0:
            raise ValueError("backend='nccl' needs CUDA GPUs, and this machine has none; "
                             "use backend='gloo' (CPU) or 'auto'")
        if gpus < nprocs:
            raise ValueError(f"backend='nccl' runs one process per GPU: nprocs={nprocs} but this "
                             f"machine has {gpus} GPU(s); lower nprocs or use backend='gloo'")
    return backend


def _check_int(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}; got {value!r}")


def _check_seconds(name: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds; got {value!r}")


def _base_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPLBACKEND", "Agg")
    return env


def launch(module: str = "helpers.ddp_train", args: list[str] | tuple[str, ...] = (), *,
           nprocs: int = 2, backend: str = "auto", threads: int = 1, timeout: float = 120,
           init_timeout: float = 30, host: str = "127.0.0.1", stream: bool = True,
           out_dir: str | Path | None = None) -> LaunchResult:
    """Run `python -m <module> <args> --backend B --out DIR --init-timeout S` in `nprocs`
    processes, as `torchrun --standalone --nproc-per-node=nprocs` would, and collect results.

    `threads`: intra-op threads per process (OMP_NUM_THREADS and `--threads`).
    `timeout`: deadline for the whole run; `init_timeout`: for `init_process_group`.
    Raises `LaunchError` (with the failing rank's traceback) when a rank fails or time runs out.
    """
    _check_int("nprocs", nprocs, 1)
    _check_int("threads", threads, 1)
    _check_seconds("timeout", timeout)
    _check_seconds("init_timeout", init_timeout)
    if not isinstance(module, str) or not module:
        raise ValueError("module must be a dotted module name such as 'helpers.ddp_train'")
    backend = resolve_backend(backend, nprocs)
    # As torchrun's agent does, this process hosts the rendezvous store (on a port the OS picks,
    # so two launches never collide) and every rank is a client of it. Then the ranks may exit in
    # any order: with rank 0 hosting it, rank 0 leaving first could abort a rank still in its
    # teardown ("terminate called without an active exception").
    store = bound_store(host, nprocs, timeout)  # listens on `host` only
    port = store.port
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="ddp_", dir=_runs_dir()))
    out.mkdir(parents=True, exist_ok=True)
    cmds, envs = [], []
    for rank in range(nprocs):
        env = _base_env(threads)
        env.update(_loopback_env(host))
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nprocs),
                   LOCAL_WORLD_SIZE=str(nprocs), GROUP_RANK="0", MASTER_ADDR=host,
                   MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
        cmds.append([sys.executable, "-m", module, *map(str, args), "--backend", backend,
                     "--threads", str(threads), "--out", str(out),
                     "--init-timeout", str(init_timeout)])
        envs.append(env)
    if stream:
        print(f"[launch] {nprocs} process(es), backend={backend}, {threads} thread(s) each, "
              f"rendezvous {host}:{port}")
    t0 = time.perf_counter()
    try:
        codes, outputs, pids = run_processes(cmds, envs, timeout=timeout, stream=stream,
                                             labels=[f"rank {r}" for r in range(nprocs)],
                                             error_dir=out)
    finally:
        del store  # closes the rendezvous server once every rank is gone
    return LaunchResult(nprocs=nprocs, backend=backend, port=port,
                        seconds=time.perf_counter() - t0, results=read_results(out),
                        outputs=outputs, returncodes=codes, pids=pids, out_dir=str(out))


def torchrun_command(module: str, args: list[str] | tuple[str, ...], *, nnodes: int,
                     nproc_per_node: int, endpoint: str, rdzv_id: str,
                     python: str = "python", runner: str = "torch.distributed.run",
                     rdzv_conf: str = "", local_addr: str = "") -> list[str]:
    """The `torchrun` command one node runs to join a c10d rendezvous at `endpoint`."""
    return [python, "-m", runner, f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}", "--max-restarts=0",
            *([f"--rdzv-conf={rdzv_conf}"] if rdzv_conf else []),
            *([f"--local-addr={local_addr}"] if local_addr else []),
            "-m", module, *map(str, args)]


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


def launch_torchrun_nodes(module: str = "helpers.ddp_train",
                          args: list[str] | tuple[str, ...] = (), *, nnodes: int = 2,
                          nproc_per_node: int | list[int] = 1, threads: int = 1,
                          timeout: float = 180,
                          init_timeout: float = 60, host: str = "127.0.0.1",
                          stream: bool = True) -> LaunchResult:
    """Start `nnodes` torchrun agents on this machine, each pretending to be one machine, that
    meet at a c10d rendezvous on `host` (loopback) and run `module` together. On real machines
    each would run the same `torchrun_command` with `--rdzv-endpoint` = the first node's address.
    `nproc_per_node` may be a list (one entry per node): nodes need not be alike.
    """
    _check_int("nnodes", nnodes, 1)
    per_node = nproc_per_node if isinstance(nproc_per_node, list) else [nproc_per_node] * nnodes
    if len(per_node) != nnodes:
        raise ValueError(f"nproc_per_node: give one count per node ({nnodes}); got {per_node}")
    for n in per_node:
        _check_int("nproc_per_node", n, 1)
    _check_int("threads", threads, 1)
    _check_seconds("timeout", timeout)
    _check_seconds("init_timeout", init_timeout)
    backend = resolve_backend("auto", sum(per_node))  # nccl: one GPU per worker, all nodes
    # This process hosts the c10d rendezvous store, listening on `host` only; the nodes join it
    # as clients (is_host=0) and the first one's store for the workers is bound the same way.
    store = bound_store(host, 1, timeout, multi_tenant=True)
    port = store.port
    out = Path(tempfile.mkdtemp(prefix="torchrun_", dir=_runs_dir()))
    rdzv_id = f"ftg{port}"
    full_args = [*map(str, args), "--backend", backend, "--threads", str(threads),
                 "--out", str(out), "--init-timeout", str(init_timeout)]
    cmds = [torchrun_command(module, full_args, nnodes=nnodes, nproc_per_node=n,
                             endpoint=f"{host}:{port}", rdzv_id=rdzv_id, python=sys.executable,
                             runner="helpers.launch", rdzv_conf="is_host=0", local_addr=host)
            for n in per_node]
    envs, first_gpu = [], 0
    for n in per_node:
        env = _base_env(threads)
        env.update(_loopback_env(host))
        env.setdefault("LOGLEVEL", "WARNING")
        if backend == "nccl":  # "nodes" on one machine must not share GPUs: give each its own
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(first_gpu, first_gpu + n))
            first_gpu += n
        envs.append(env)
    if stream:
        print(f"[launch] {nnodes} torchrun node(s) with {per_node} process(es), "
              f"c10d rendezvous {host}:{port} (id {rdzv_id}), backend={backend}")
        for i, cmd in enumerate(cmds):
            print(f"[launch] node {i} runs: " + " ".join(
                ["torchrun", *cmd[3:]]).replace(str(out), "<out>"))
    t0 = time.perf_counter()
    try:
        codes, outputs, pids = run_processes(cmds, envs, timeout=timeout, stream=stream,
                                             labels=[f"node {n}" for n in range(nnodes)],
                                             error_dir=out)
    finally:
        del store
    return LaunchResult(nprocs=sum(per_node), backend=backend, port=port,
                        seconds=time.perf_counter() - t0, results=read_results(out),
                        outputs=outputs, returncodes=codes, pids=pids, out_dir=str(out))


def read_results(out: str | Path) -> dict[int, dict[str, Any]]:
    """Each rank's `rank<r>.json` from a run's output folder."""
    res = {}
    for p in Path(out).glob("rank*.json"):
        if p.name.endswith(".error.json"):
            continue
        data = json.loads(p.read_text())
        res[int(data["rank"])] = data
    return dict(sorted(res.items()))


KEEP_RUNS = 20


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


def _kill_group(p: subprocess.Popen, hard: bool) -> None:
    """End the worker and every process it started: SIGTERM (or SIGKILL when `hard`) to its own
    session on POSIX; on Windows, which has neither `os.killpg` nor SIGKILL, psutil walks the tree."""
    if hasattr(os, "killpg"):
        try:
            os.killpg(p.pid, signal.SIGKILL if hard else signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        return
    import psutil

    try:
        root = psutil.Process(p.pid)
        tree = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for proc in tree:
        try:
            proc.kill() if hard else proc.terminate()
        except psutil.Error:
            pass


def _stop_all(procs: list[subprocess.Popen], grace: float = 3.0) -> None:
    for p in procs:
        if p.poll() is None:
            _kill_group(p, hard=False)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        _kill_group(p, hard=True)  # also reaps grandchildren left in the group
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _first_error(error_dir: Path | None) -> tuple[int | None, str]:
    """The earliest traceback a worker recorded (`rank<r>.error.json`): the root cause, not the
    ranks that failed afterwards because their peer vanished."""
    if error_dir is None:
        return None, ""
    errs = []
    for p in Path(error_dir).glob("rank*.error.json"):
        try:
            e = json.loads(p.read_text())
            errs.append((e["time"], e["rank"], e["traceback"]))
        except (json.JSONDecodeError, KeyError, OSError):
            continue
    if not errs:
        return None, ""
    _, rank, tb = min(errs)
    return rank, tb


def _tail_traceback(lines: list[str]) -> str:
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback"):
            return "\n".join(lines[i:])
    return "\n".join(lines[-20:])


def run_processes(cmds: list[list[str]], envs: list[dict[str, str]], *, timeout: float,
                  stream: bool = True, labels: list[str] | None = None,
                  error_dir: Path | None = None, settle: float = 1.0,
                  ) -> tuple[dict[int, int | None], dict[int, list[str]], list[int]]:
    """Run the commands together; stream their merged stdout/stderr line by line; return
    (return codes, output lines, pids). On the first failure (or at the deadline) stop all."""
    if len(cmds) != len(envs):
        raise ValueError("run_processes: cmds and envs must have the same length")
    labels = labels or [str(i) for i in range(len(cmds))]
    q: queue.Queue = queue.Queue()
    procs: list[subprocess.Popen] = []
    outputs: dict[int, list[str]] = {i: [] for i in range(len(cmds))}
    open_pipes = len(cmds)
    failed: int | None = None
    timed_out = False
    t_noticed = float("nan")
    try:
        for i, (cmd, env) in enumerate(zip(cmds, envs, strict=True)):
            # its own session (so a stop reaches its children too), and a SIGTERM when this
            # process dies: a rank never outlives the kernel that launched it
            p = subprocess.Popen(cmd, env=env, cwd=str(REPO_ROOT), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, bufsize=1,
                                 start_new_session=True,
                                 preexec_fn=processes.parent_death_hook(signal.SIGTERM))
            procs.append(p)
            threading.Thread(target=_reader, args=(i, p.stdout, q), daemon=True).start()
        deadline = time.monotonic() + timeout
        while open_pipes or any(p.poll() is None for p in procs):
            try:
                idx, line = q.get(timeout=0.1)
                if line is None:
                    open_pipes -= 1
                else:
                    outputs[idx].append(line)
                    if stream:
                        print(f"[{labels[idx]}] {line}", flush=True)
            except queue.Empty:
                pass
            bad = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if bad:
                failed = bad[0]
                t_noticed = time.monotonic()
                break
            if time.monotonic() > deadline:
                timed_out = True
                t_noticed = time.monotonic()
                break
        if failed is not None:
            # let the other ranks notice and record their own errors, briefly, then stop them
            end = time.monotonic() + settle
            while time.monotonic() < end and any(p.poll() is None for p in procs):
                time.sleep(0.05)
    finally:
        _stop_all(procs)
        stop_seconds = time.monotonic() - t_noticed
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
                outputs[idx].append(line)
                if stream and (failed is not None or timed_out):
                    print(f"[{labels[idx]}] {line}", flush=True)
    codes = {i: p.returncode for i, p in enumerate(procs)}
    pids = [p.pid for p in procs]
    if failed is None and not timed_out:
        return codes, outputs, pids
    rank, tb = _first_error(error_dir)
    if rank is None and failed is not None:
        rank, tb = failed, _tail_traceback(outputs[failed])
    if timed_out:
        msg = (f"run timed out after {timeout:g} s; all {len(procs)} processes were stopped"
               + (f" (rank {rank} had failed)" if rank is not None else ""))
    else:
        msg = (f"rank {rank} failed (exit code {codes.get(failed)} for {labels[failed]}); "
               f"all {len(procs)} processes were stopped")
    raise LaunchError(msg + (f"\n--- traceback of rank {rank} ---\n{tb}" if tb else ""),
                      failed_rank=rank, traceback=tb, outputs=outputs, returncodes=codes,
                      pids=pids, stop_seconds=stop_seconds)


def exit_rank(code: int) -> None:
    """End a rank's process with `code` once its work is done and its process group is gone.

    `os._exit` skips the interpreter's and C++ libraries' teardown: rarely (about 1 run in 20
    with two launches at once on 2 cores), a gloo rank whose work had finished aborted there with
    "terminate called without an active exception", turning a finished run into a failed one.
    Everything a rank writes is closed by then; stdout and stderr are flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_rank(body: Callable[[], int], rank: int, out: Path | None) -> int:
    """The worker side of the launcher's contract: run `body()`; if it raises, write the
    traceback to `<out>/rank<N>.error.json` (which `launch` reads to show the failing rank)
    and print it; always leave the process group. Returns the process's exit code."""
    processes.die_with_parent(signal.SIGTERM)  # also under torchrun, whose agent is the parent
    try:
        return body()
    except BaseException:
        tb = traceback.format_exc()
        if out:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"rank{rank}.error.json").write_text(
                json.dumps({"rank": rank, "time": time.time(), "traceback": tb}))
        print(tb, file=sys.stderr, flush=True)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":  # python -m helpers.launch <torchrun arguments>: see torchrun_bound
    torchrun_bound()
