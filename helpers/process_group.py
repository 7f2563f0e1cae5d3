"""Joining a process group on a rank (the scripts `helpers.launch` and `torchrun` start).

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

import os
from collections.abc import Callable, MutableMapping
from datetime import timedelta

import torch
import torch.distributed as dist


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


def rank_device(backend: str, local_rank: int) -> tuple[str, torch.device]:
    """(backend, device) of a data-parallel rank: 'auto' is nccl when this rank has a GPU of its
    own, else gloo on the CPU; nccl binds the rank to its GPU."""
    if backend == "auto":
        backend = "nccl" if torch.cuda.device_count() > local_rank else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return backend, torch.device("cuda", local_rank)
    return backend, torch.device("cpu")


def init(backend: str, *, device: torch.device, init_timeout: float, timeout: float = 300.0,
         rank: int | None = None, world_size: int | None = None) -> None:
    """Join the default process group from the torchrun environment (MASTER_ADDR, RANK, ...)."""
    for name, v in (("init_timeout", init_timeout), ("timeout", timeout)):
        if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"process_group.init: {name} must be a positive number of seconds, got {v!r}")
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_WORLD_SIZE", torch.cuda.device_count()))
        note = p2p_fallback(min(local, torch.cuda.device_count()))
        if note and int(os.environ.get("LOCAL_RANK", 0)) == 0:
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
