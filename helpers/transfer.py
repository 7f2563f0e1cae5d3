"""How long does moving a tensor take? Host-to-device copies, pageable vs pinned, sync vs async.

A host-to-device copy from ordinary (pageable) memory is staged through a pinned buffer by the
driver and blocks the CPU; from pinned (page-locked) memory the GPU's DMA engine reads it
directly, and with `non_blocking=True` the CPU goes on queueing work while the copy runs.
Without a GPU the closest honest measurement is a host memory copy (`clone`), which shows
bandwidth against size but not the PCIe link.
"""

from __future__ import annotations

import torch

from .devices import as_device
from .timing import Measurement, benchmark


def host_tensor(nbytes: int, *, pinned: bool = False) -> torch.Tensor:
    """A float32 host tensor of about `nbytes` bytes (pinned only when CUDA is available)."""
    if not isinstance(nbytes, int) or nbytes < 4:
        raise ValueError(f"nbytes must be an int >= 4, got {nbytes!r}")
    t = torch.randn(nbytes // 4)
    if pinned:
        if not torch.cuda.is_available():
            raise ValueError("pinned=True needs CUDA: page-locked memory is a GPU-driver feature")
        t = t.pin_memory()
    return t


def copy_time(nbytes: int, device: str | torch.device, *, pinned: bool = False,
              non_blocking: bool = False, repeats: int = 5) -> Measurement:
    """Seconds to copy `nbytes` from host memory to `device` (a CPU `clone` when device is cpu)."""
    dev = as_device(device)  # a clear error for 'cuda' on a machine without one
    src = host_tensor(nbytes, pinned=pinned)
    if dev.type == "cpu":
        return benchmark(lambda: src.clone(), repeats=repeats, label=f"host copy {nbytes} B")
    return benchmark(lambda: src.to(dev, non_blocking=non_blocking), repeats=repeats,
                     label=f"H2D {'pinned' if pinned else 'pageable'} {nbytes} B")


def gb_per_s(nbytes: int, m: Measurement) -> float:
    return nbytes / m.median / 1e9
