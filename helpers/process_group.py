"""A rank's set-up, one for every worker script (`ddp_train`, `ddp_lessons`, `model_split`, tests).

- `setup`: what every rank does first, in one place: die with its parent (the torchrun agent),
  set its intra-op threads, pick the backend by the one rule (`resolve_backend`: nccl when each
  process of this machine has a GPU of its own, else gloo), bind its GPU, `init` the process
  group; it leaves the group at the end of the `with` block.
- `record`: torchrun's `@record` for a worker's `main` (its traceback reaches the launcher
  through torchrun's error file), with the rank and the exact time added to that file;
  `run(main)` runs it and ends the process without the interpreter's teardown.
- `init`: `init_process_group` with two timeouts. `init_timeout` bounds the rendezvous, so a
  rank that never arrives fails the others within seconds; `timeout` bounds every collective
  after it (NCCL's watchdog aborts one that exceeds it), which must allow for a slow first step
  (compilation, data loading). One value cannot do both: `init_process_group(timeout=...)`
  applies its timeout to every collective. With NCCL the rank's GPU is bound (`device_id`), so
  the communicator forms at once, under the init deadline, and collectives know their GPU.
- `barrier`: `dist.barrier`, with `device_ids` on NCCL (without it NCCL guesses the GPU from
  the rank, which is wrong when ranks do not map to cuda:0, cuda:1, ...).
- `p2p_fallback`: when two of this node's GPUs cannot reach each other's memory directly
  (peer-to-peer unavailable: some PCIe topologies, virtual machines), NCCL is told to copy
  through host memory (`NCCL_P2P_DISABLE=1`) instead of failing or hanging there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, MutableMapping
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import errors

from . import processes
from .checks import check_choice, check_int, check_seconds

BACKENDS = ("auto", "gloo", "nccl")
_F = TypeVar("_F", bound=Callable[..., Any])


def p2p_fallback(n_gpus: int, *, can_access: Callable[[int, int], bool] | None = None,
                 env: MutableMapping[str, str] | None = None) -> str | None:
    """Set `NCCL_P2P_DISABLE=1` in `env` when some pair of GPUs 0..n_gpus-1 lacks peer access.

    Returns a sentence saying what was done, or None (all pairs reach each other, fewer than two
    GPUs, or the variable was already set by the user, whose choice wins)."""
    env = os.environ if env is None else env
    if n_gpus < 2 or "NCCL_P2P_DISABLE" in env:
        return None
    can_access = can_access or torch.cuda.can_device_access_peer
    missing = [(i, j) for i in range(n_gpus) for j in range(n_gpus) if i != j and not can_access(i, j)]
    if not missing:
        return None
    env["NCCL_P2P_DISABLE"] = "1"
    i, j = missing[0]
    return (f"GPU {i} cannot access GPU {j}'s memory directly (no peer-to-peer): NCCL_P2P_DISABLE=1, "
            "so NCCL copies through host memory (slower, but it runs)")


def resolve_backend(backend: str, local_procs: int) -> str:
    """The one backend rule, for the launcher and every rank: 'auto' is nccl when each of the
    `local_procs` processes on this machine has a GPU of its own, else gloo; impossible requests
    (nccl without enough GPUs) are refused. Every rank of a job reaches the same answer."""
    check_choice("backend", backend, BACKENDS, where="resolve_backend")
    check_int("local_procs", local_procs, 1, where="resolve_backend")
    gpus = torch.cuda.device_count()
    if backend == "auto":
        return "nccl" if gpus >= local_procs and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and gpus == 0:
        raise ValueError("backend='nccl' needs CUDA GPUs, and this machine has none; "
                         "use backend='gloo' (CPU) or 'auto'")
    if backend == "nccl" and gpus < local_procs:
        raise ValueError(f"backend='nccl' runs one process per GPU: {local_procs} processes but "
                         f"this machine has {gpus} GPU(s); use fewer processes or backend='gloo'")
    return backend


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


@contextlib.contextmanager
def setup(backend: str = "auto", *, threads: int = 1, init_timeout: float = 60.0,
          timeout: float = 300.0) -> Iterator[tuple[str, torch.device]]:
    """Join the job as this process's rank (RANK, LOCAL_RANK, ... from torchrun's environment;
    none: a job of one) and yield (backend, device); leave the process group afterwards."""
    processes.die_with_parent(signal.SIGTERM)  # the agent (or kernel) that started us is gone: so are we
    torch.set_num_threads(check_int("threads", threads, 1, where="setup"))
    local_rank = _env_int("LOCAL_RANK", 0)
    backend = resolve_backend(backend, _env_int("LOCAL_WORLD_SIZE", _env_int("WORLD_SIZE", 1)))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init(backend, device=device, init_timeout=init_timeout, timeout=timeout)
    try:
        yield backend, device
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class _RankErrors(errors.ErrorHandler):
    """torchrun's error file plus `rank` and `time`: its own timestamp counts whole seconds, too
    coarse to tell the first failure from the ranks that failed because of it (a tie goes to the
    lowest rank), and the agent knows local ranks only."""

    def record_exception(self, e: BaseException) -> None:
        super().record_exception(e)
        path = self._get_error_file_path()
        if path and os.path.isfile(path):
            data = json.loads(Path(path).read_text())
            data["message"]["extraInfo"].update(rank=os.environ.get("RANK", "0"), time=repr(time.time()))
            Path(path).write_text(json.dumps(data))


def record(main: _F) -> _F:
    """torchrun's `@record` for a worker's `main`: an exception is written to the error file the
    agent names (TORCHELASTIC_ERROR_FILE), which `helpers.launch` reads, then raised."""
    return errors.record(main, error_handler=_RankErrors())


def run(main: Callable[[], int | None]) -> NoReturn:
    """A worker script's last line, `process_group.run(main)`: run its `@record`-ed `main`, print
    the traceback if it raised (`@record` has filed it already), and end the process at once, so
    the agent sees a failure within its next look (0.1 s), not after a second of teardown."""
    try:
        code = main()
    except SystemExit as e:  # argparse has said why
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_rank(code)


def exit_rank(code: int | None) -> NoReturn:
    """End this process with `code` now; its work is done and its process group is gone.

    `os._exit` skips the interpreter's and C++ libraries' teardown: rarely (about 1 run in 20
    with two launches at once on 2 cores), a gloo rank whose work had finished aborted there with
    "terminate called without an active exception", turning a finished run into a failed one.
    Everything a rank writes is closed by then; stdout and stderr are flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def init(backend: str, *, device: torch.device, init_timeout: float, timeout: float = 300.0,
         rank: int | None = None, world_size: int | None = None) -> None:
    """Join the default process group from the torchrun environment (MASTER_ADDR, RANK, ...);
    without one (a plain `python -m ...`), a group of one on an in-memory store: no socket."""
    check_seconds("init_timeout", init_timeout, where="process_group.init")
    check_seconds("timeout", timeout, where="process_group.init")
    if "MASTER_ADDR" not in os.environ and _env_int("WORLD_SIZE", 1) == 1:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=timeout),
                                device_id=device if backend == "nccl" else None)
        return
    if backend == "nccl":
        local = _env_int("LOCAL_WORLD_SIZE", torch.cuda.device_count())
        note = p2p_fallback(min(local, torch.cuda.device_count()))
        if note and _env_int("LOCAL_RANK", 0) == 0:
            print(note, flush=True)
    rendezvous_timeout = timedelta(seconds=init_timeout)
    store, rank, world_size = next(dist.rendezvous(
        "env://", rank if rank is not None else -1, world_size if world_size is not None else -1,
        timeout=rendezvous_timeout))
    store.set_timeout(rendezvous_timeout)  # NCCL's communicator set-up reads the store too
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout),
                            device_id=device if backend == "nccl" else None)


def barrier(device: torch.device) -> None:
    """Every rank waits here; on NCCL the barrier runs on this rank's own GPU."""
    if dist.get_backend() == "nccl" and device.type == "cuda":
        dist.barrier(device_ids=[device.index if device.index is not None else torch.cuda.current_device()])
    else:
        dist.barrier()
