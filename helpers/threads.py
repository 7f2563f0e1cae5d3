"""Run a block with a given number of CPU threads for PyTorch's intra-op parallelism.

Splitting a tiny matrix product over several threads costs more in hand-offs than it saves,
and on a machine whose cores are shared, a thread waiting at a barrier for a descheduled
partner can make small-tensor loops many times slower. Lessons whose *timing does not matter*
(correctness checks, learning-rate runs on a small MLP) use `cpu_threads(1)`; measurements of
throughput keep the machine's default.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from .checks import check_int


@contextlib.contextmanager
def cpu_threads(n: int) -> Iterator[int]:
    """Set `torch.set_num_threads(n)` inside the block, restore the previous value after it."""
    check_int("n", n, 1, where="cpu_threads")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


# The thread count this process started with: `helpers` is imported before any notebook changes
# it, so a setup cell run a second time reads the machine's default, not its own earlier change.
_STARTED_WITH = torch.get_num_threads()


def started_with() -> int:
    """PyTorch's intra-op thread count when this process first imported `helpers.threads`."""
    return _STARTED_WITH


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, e.g. a container's limit)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def share(processes: int = 1) -> int:
    """Intra-op threads per process when `processes` busy processes (this one, DataLoader
    workers, ranks) run at once: threads x processes <= cores, at least 1. More threads than
    cores makes each thread wait at every barrier for a partner that is not running: a 2-core
    training run slowed more than 20x beside one other busy process that way."""
    check_int("processes", processes, 1, where="share")
    return max(1, usable_cores() // processes)
