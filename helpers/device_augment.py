"""Augmentation done on the device, a whole batch at a time, with vectorised tensor ops.

The data set lives on the device as one uint8 tensor (N, C, H, W) (50,000 CIFAR-10 images
are 150 MB); each batch is padded, randomly cropped, randomly flipped and normalised by a few
tensor ops over the whole batch, with *per-sample* random offsets and flips. No decode, no
per-sample Python, no worker processes: the spirit of NVIDIA DALI, in plain PyTorch.

    aug = DeviceAugment(pad=4, crop=32, flip=True, mean=CIFAR_MEAN, std=CIFAR_STD, seed=0)
    batches = TensorBatches(x_uint8, y, 512, augment=aug, device="cuda", seed=0)
    for X, y in batches:   # one epoch per loop, a new shuffle each time
        ...   # X: float32 (B, C, 32, 32) on the device, normalised

Works the same on the CPU (it is simply the fastest way to augment there too). `TensorBatches`
is the one batch source for data held as tensors, resident on the device or in host memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch
from torch.nn import functional as F

from .checks import check_choice, check_int
from .devices import as_device
from .pipelines import CIFAR_MEAN, CIFAR_STD


def _check_uint8_batch(x: object, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4:
        got = f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a uint8 tensor of shape (N, C, H, W), got {got}")
    return x


class DeviceAugment:
    """Pad + random crop + random horizontal flip + normalise, over a uint8 batch on any device.

    Each sample gets its own crop offset and flip, drawn from a generator that lives on the
    batch's device (seeded with `seed`, so a run is reproducible). Returns float32
    (N, C, crop, crop); with `mean`/`std` = None it returns values in [0, 1].
    """

    def __init__(self, *, pad: int = 4, crop: int = 32, flip: bool = True,
                 mean: Sequence[float] | None = CIFAR_MEAN,
                 std: Sequence[float] | None = CIFAR_STD, seed: int = 0) -> None:
        check_int("pad", pad, 0, where="DeviceAugment")
        check_int("crop", crop, 1, where="DeviceAugment")
        if (mean is None) != (std is None):
            raise ValueError("DeviceAugment: give both mean and std, or neither")
        if std is not None and any(s <= 0 for s in std):
            raise ValueError(f"DeviceAugment: std must be positive, got {std!r}")
        self.pad, self.crop, self.flip, self.seed = pad, crop, bool(flip), seed
        self.mean = None if mean is None else torch.tensor(mean, dtype=torch.float32)
        self.std = None if std is None else torch.tensor(std, dtype=torch.float32)
        self._gens: dict[str, torch.Generator] = {}
        self._consts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def __repr__(self) -> str:
        return (f"DeviceAugment(pad={self.pad}, crop={self.crop}, flip={self.flip}, "
                f"normalise={self.mean is not None}, seed={self.seed})")

    def generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._gens:
            self._gens[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self._gens[key]

    def _scale_shift(self, c: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # (x / 255 - mean) / std  ==  x * scale + shift, one fused multiply-add per pixel.
        key = f"{device}:{c}"
        if key not in self._consts:
            if self.mean is None:
                scale, shift = torch.full((c,), 1 / 255), torch.zeros(c)
            else:
                if len(self.mean) != c:
                    raise ValueError(f"DeviceAugment: mean/std have {len(self.mean)} channels, "
                                     f"the batch has {c}")
                scale, shift = 1 / (255 * self.std), -self.mean / self.std
            self._consts[key] = (scale.view(1, c, 1, 1).to(device), shift.view(1, c, 1, 1).to(device))
        return self._consts[key]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = _check_uint8_batch(x)
        n, c, h, w = x.shape
        p, k = self.pad, self.crop
        if k > h + 2 * p or k > w + 2 * p:
            raise ValueError(f"DeviceAugment: crop={k} is larger than the padded image "
                             f"({h + 2 * p}x{w + 2 * p})")
        dev = x.device
        g = self.generator(dev)
        xp = F.pad(x, (p, p, p, p)) if p else x  # zero padding, like torchvision's RandomCrop
        # Per-sample offsets, then index grids: rows (N, k), cols (N, k).
        oy = torch.randint(0, h + 2 * p - k + 1, (n, 1), device=dev, generator=g)
        ox = torch.randint(0, w + 2 * p - k + 1, (n, 1), device=dev, generator=g)
        ar = torch.arange(k, device=dev).view(1, k)
        rows = oy + ar
        cols = ox + ar
        if self.flip:
            flip = torch.rand((n, 1), device=dev, generator=g) < 0.5
            cols = torch.where(flip, ox + (k - 1) - ar, cols)  # mirrored column order
        # Two gathers for the whole batch: first each sample's k rows, then its k columns (in
        # mirrored order when flipped). The index tensors are broadcast views, never copied per
        # pixel; one 4-D fancy index does the same but is ~2.5x slower on a CPU.
        wp = w + 2 * p
        out = xp.gather(2, rows.view(n, 1, k, 1).expand(n, c, k, wp))
        out = out.gather(3, cols.view(n, 1, 1, k).expand(n, c, k, k))
        scale, shift = self._scale_shift(c, dev)
        return torch.addcmul(shift, out.to(torch.float32), scale)


def find_crop(out: torch.Tensor, x: torch.Tensor, augment: DeviceAugment,
              atol: float = 1e-4) -> tuple[int, int, bool] | None:
    """Which (row offset, column offset, flipped) of the padded `x` (C, H, W, uint8) gives the
    augmented image `out` (C, k, k)? None when no crop matches - a check of `DeviceAugment`
    against the definition, one candidate at a time (slow; for tests and asserts)."""
    ref = DeviceAugment(pad=0, crop=x.shape[-1], flip=False,
                        mean=None if augment.mean is None else augment.mean.tolist(),
                        std=None if augment.std is None else augment.std.tolist())
    p, k = augment.pad, augment.crop
    # Pad the *uint8* image with zeros first, then normalise, exactly as DeviceAugment does.
    xp = F.pad(x.unsqueeze(0), (p, p, p, p))
    ref.crop = xp.shape[-1]
    full = ref(xp)[0].to(out.device)
    for dy in range(xp.shape[-2] - k + 1):
        for dx in range(xp.shape[-1] - k + 1):
            cand = full[:, dy:dy + k, dx:dx + k]
            if torch.allclose(cand, out, atol=atol):
                return dy, dx, False
            if augment.flip and torch.allclose(cand.flip(-1), out, atol=atol):
                return dy, dx, True
    return None


def to_unit_float(x: torch.Tensor) -> torch.Tensor:
    """uint8 -> float32 in [0, 1]: exactly torchvision `ToTensor()`'s values, in one batch op."""
    return x.float().div_(255)


class TensorBatches:
    """Re-iterable (X, y) batches from uint8 tensors: each `iter()` is one epoch, shuffled from
    `seed + epoch number` by a permutation drawn where the data lives. Use it where a DataLoader was.

    `mode="device"`: the data set is moved to `device` once, here, and each batch is one gather
    there (a no-op move when it is already there). `mode="memory"`: it stays in host memory and
    each uint8 batch is copied to `device` (4x fewer bytes than float32) and converted there.
    `augment` turns the uint8 batch into what the model sees (`DeviceAugment`, `to_unit_float`,
    any batch function); None hands out the uint8 batch.

    `staging` (memory mode; default: on a CUDA device): gather each batch with
    `index_select(..., out=)` into one of two reusable pinned buffers, so `non_blocking=True` is a
    real asynchronous copy (indexing a pinned tensor, `x[sel]`, returns pageable memory, which CUDA
    copies through a staging buffer of its own, synchronously). Two buffers in turn, each reused
    only after an event says the copy that read it has finished.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, *,
                 augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 device: str | torch.device | None = None, mode: str = "device",
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 staging: bool | None = None) -> None:
        x = _check_uint8_batch(x, "TensorBatches: x")
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
        self.staging = (self.device.type == "cuda") if staging is None else bool(staging)
        self._bufs: list[list] = []
        if mode == "memory" and self.staging:
            pin = self.device.type == "cuda" and torch.cuda.is_available()  # pinning needs CUDA
            self._bufs = [[torch.empty((batch_size, *x.shape[1:]), dtype=x.dtype, pin_memory=pin),
                           torch.empty((batch_size, *y.shape[1:]), dtype=y.dtype, pin_memory=pin),
                           None] for _ in range(2)]

    def __len__(self) -> int:
        n = len(self.x)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n, where = len(self.x), self.x.device
        if self.shuffle:
            g = torch.Generator(device=where).manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, device=where, generator=g)
        else:
            order = torch.arange(n, device=where)
        self.epoch += 1
        return self._batches(order)

    def _batches(self, order: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.x)
        stop = n - n % self.batch_size if self.drop_last else n
        for i, start in enumerate(range(0, stop, self.batch_size)):
            sel = order[start:start + self.batch_size]
            if self.mode == "device":
                xb, yb = self.x[sel], self.y[sel]
            elif not self._bufs:
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
