"""Augmentation done on the device, a whole batch at a time, with vectorised tensor ops.

The data set lives on the device as one uint8 tensor (N, C, H, W) (50,000 CIFAR-10 images
are 150 MB); each batch is padded, randomly cropped, randomly flipped and normalised by a few
tensor ops over the whole batch, with *per-sample* random offsets and flips. No decode, no
per-sample Python, no worker processes: the spirit of NVIDIA DALI, in plain PyTorch.

    aug = DeviceAugment(pad=4, crop=32, flip=True, mean=CIFAR_MEAN, std=CIFAR_STD, seed=0)
    for X, y in device_batches(x_uint8, y, batch_size=512, augment=aug, device="cuda", seed=0):
        ...   # X: float32 (B, C, 32, 32) on the device, normalised

Works the same on the CPU (it is simply the fastest way to augment there too).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.nn import functional as F

from .devices import as_device
from .pipelines import CIFAR_MEAN, CIFAR_STD


def _check_uint8_batch(x: object, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4:
        got = f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a uint8 tensor of shape (N, C, H, W); got {got}")
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
        for name, v, low in (("pad", pad, 0), ("crop", crop, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"DeviceAugment: {name} must be an int >= {low}, got {v!r}")
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
        # One gather for the whole batch: out[i, ch, r, q] = xp[i, ch, rows[i, r], cols[i, q]].
        idx = torch.arange(n, device=dev).view(n, 1, 1, 1)
        ch = torch.arange(c, device=dev).view(1, c, 1, 1)
        out = xp[idx, ch, rows.view(n, 1, k, 1), cols.view(n, 1, 1, k)]
        scale, shift = self._scale_shift(c, dev)
        return torch.addcmul(shift, out.to(torch.float32), scale)


def device_batches(x_uint8: torch.Tensor, y: torch.Tensor, batch_size: int,
                   augment: DeviceAugment | None = None, device: str | torch.device | None = None,
                   shuffle: bool = True, seed: int = 0,
                   drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of (X, y) batches from a data set resident on `device`.

    The uint8 data is moved to the device once (a no-op when it is already there: keep the
    moved tensor and pass it in again for later epochs). Shuffling uses a permutation drawn on
    the device from `seed`. `augment` (e.g. `DeviceAugment`) turns each uint8 batch into the
    float batch the model sees; without it the uint8 batch is returned.
    """
    x_uint8 = _check_uint8_batch(x_uint8, "x_uint8")
    if not isinstance(y, torch.Tensor) or len(y) != len(x_uint8):
        raise ValueError(f"y must be a tensor with one label per image ({len(x_uint8)})")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    dev = as_device(device)
    x_dev = x_uint8.to(dev, non_blocking=True)
    y_dev = y.to(dev, non_blocking=True)
    n = len(x_dev)
    if shuffle:
        g = torch.Generator(device=dev).manual_seed(seed)
        order = torch.randperm(n, device=dev, generator=g)
    else:
        order = torch.arange(n, device=dev)
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        sel = order[start:start + batch_size]
        xb = x_dev[sel]
        yield (augment(xb) if augment is not None else xb), y_dev[sel]


def to_device_once(x_uint8: torch.Tensor, y: torch.Tensor,
                   device: str | torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Move the whole uint8 data set to `device` once (validated), for `device_batches`."""
    x_uint8 = _check_uint8_batch(x_uint8, "x_uint8")
    dev = as_device(device)
    return x_uint8.to(dev), y.to(dev)


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


class DeviceLoader:
    """A re-iterable `device_batches`: each `iter()` is one more epoch, with a new shuffle
    (seed + epoch number). Moves the data to `device` once, here. Use it where a DataLoader was."""

    def __init__(self, x_uint8: torch.Tensor, y: torch.Tensor, batch_size: int,
                 augment: DeviceAugment | None = None, device: str | torch.device | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.x, self.y = to_device_once(x_uint8, y, device)
        self.device = self.x.device
        self.batch_size, self.augment, self.shuffle = batch_size, augment, shuffle
        self.seed, self.drop_last, self.epoch = seed, drop_last, 0

    def __len__(self) -> int:
        n = len(self.x)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        seed = self.seed + self.epoch
        self.epoch += 1
        return device_batches(self.x, self.y, self.batch_size, self.augment, self.device,
                              shuffle=self.shuffle, seed=seed, drop_last=self.drop_last)
