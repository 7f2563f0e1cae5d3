"""`TensorBatches`: (X, y) batches from a data set held as uint8 tensors, on the device or in
host memory, used where a DataLoader was (notebooks 11-12, the capstone). Notebook 03 writes
the same loop out, with its batched crop and flip; `augment` takes any batch function.

    batches = TensorBatches(x_uint8, y, 512, augment=to_unit_float, device="cuda", seed=0)
    for X, y in batches:   # one epoch per loop, a new shuffle each time
        ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from .checks import check_choice, check_int
from .devices import as_device


def to_unit_float(x: torch.Tensor) -> torch.Tensor:
    """uint8 -> float32 in [0, 1]: exactly torchvision `ToTensor()`'s values, in one batch op."""
    return x.float().div_(255)


class TensorBatches:
    """Re-iterable (X, y) batches from uint8 tensors: each `iter()` is one epoch, shuffled from
    `seed + epoch number` by a permutation drawn where the data lives.

    `mode="device"`: the data set is moved to `device` once, here, and each batch is one gather
    there. `mode="memory"`: it stays in host memory and each uint8 batch is copied to `device`
    (4x fewer bytes than float32) and converted there by `augment` (None: the uint8 batch).

    `staging` (memory mode; default: on a CUDA device): gather each batch with
    `index_select(..., out=)` into one of two reusable pinned buffers, so `non_blocking=True` is a
    real asynchronous copy (`x[sel]` of a pinned tensor returns pageable memory, which CUDA copies
    synchronously). A buffer is reused only after an event says the copy that read it finished.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, *,
                 augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 device: str | torch.device | None = None, mode: str = "device",
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 staging: bool | None = None) -> None:
        if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4:
            got = f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"TensorBatches: x must be a uint8 tensor of shape (N, C, H, W), got {got}")
        if not isinstance(y, torch.Tensor) or len(y) != len(x):
            raise ValueError(f"TensorBatches: y must be a tensor with one label per image ({len(x)}), "
                             f"got {type(y).__name__ if not isinstance(y, torch.Tensor) else len(y)}")
        self.batch_size = check_int("batch_size", batch_size, where="TensorBatches")
        self.mode = check_choice("mode", mode, ("device", "memory"), where="TensorBatches")
        self.device = as_device(device, "TensorBatches: device")
        self.x, self.y = (x.to(self.device), y.to(self.device)) if mode == "device" else (x, y)
        self.augment, self.shuffle, self.seed, self.epoch = augment, shuffle, seed, 0
        # never drop the only (partial) batch: an epoch of zero batches trains nothing
        self.drop_last = drop_last and len(x) >= batch_size
        staging = (self.device.type == "cuda") if staging is None else bool(staging)
        pin = self.device.type == "cuda" and torch.cuda.is_available()  # pinning needs CUDA
        # two [x buffer, y buffer, event of the copy that last read them]
        self._bufs = [[torch.empty((batch_size, *t.shape[1:]), dtype=t.dtype, pin_memory=pin)
                       for t in (x, y)] + [None] for _ in range(2)] if mode == "memory" and staging else []

    def __len__(self) -> int:
        n = len(self.x)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n, where = len(self.x), self.x.device
        g = torch.Generator(device=where).manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, device=where, generator=g) if self.shuffle else torch.arange(n, device=where)
        self.epoch += 1
        return self._batches(order[:len(self) * self.batch_size] if self.drop_last else order)

    def _batches(self, order: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i, sel in enumerate(order.split(self.batch_size)):
            if not self._bufs:  # device mode: a gather there; memory mode: a plain copy
                xb = self.x[sel].to(self.device, non_blocking=True)
                yb = self.y[sel].to(self.device, non_blocking=True)
            else:
                buf = self._bufs[i % 2]
                if buf[2] is not None:
                    buf[2].synchronize()  # the copy that last read this buffer has finished
                xs, ys = buf[0][:len(sel)], buf[1][:len(sel)]
                torch.index_select(self.x, 0, sel, out=xs)
                torch.index_select(self.y, 0, sel, out=ys)
                # copy=True: on a CPU `.to` would hand out the buffer itself, overwritten two batches on
                xb = xs.to(self.device, non_blocking=True, copy=True)
                yb = ys.to(self.device, non_blocking=True, copy=True)
                if self.device.type == "cuda":
                    buf[2] = torch.cuda.Event()
                    buf[2].record()  # on the current stream, after both copies
            yield (self.augment(xb) if self.augment is not None else xb), yb
