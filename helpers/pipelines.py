"""The CPU image pipeline that real training code uses: files on disk -> decode -> augment -> batch.

    root, synthetic = prepare_image_folder(n=2048)           # PNGs of CIFAR-10 (or its stand-in)
    ds = image_folder(root, transform=cifar_train_transform())
    loader = make_loader(ds, batch_size=128, num_workers=2, prefetch_factor=2)

Everything a DataLoader worker runs (the data set, the transforms) is defined here, in an
importable module, so that workers also work where the start method is `spawn` (macOS,
Windows): a spawned worker re-imports what it runs, and cannot import a notebook cell.

`make_loader` checks its arguments *before* any worker starts, with errors that name the
parameter and the allowed values.
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torchvision
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T

from . import data, devices, paths, synthetic
from .checks import check_choice, check_int
from .devices import as_device
from .timing import benchmark

# Per-channel statistics of the real CIFAR-10 training set (the usual constants).
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
FORMATS = ("png", "jpeg")
START_METHODS = (None, "fork", "spawn", "forkserver")
_DONE = "COMPLETE.json"


# ----------------------------------------------------------------------------- data on disk

def prepare_image_folder(n: int = 2048, *, fmt: str = "png", source: str = "auto",
                         root: str | Path | None = None, quality: int = 90) -> tuple[Path, bool]:
    """Write the first `n` CIFAR-10 training images as `<root>/<class>/<i>.<fmt>` files, once.

    The images come from `helpers.data.cifar10` (the real set when present, else its synthetic
    stand-in). Returns the folder and whether the images are synthetic. A folder written
    before (complete, same `n`, format and source) is reused.
    """
    check_int("n", n, where="prepare_image_folder")
    check_choice("fmt", fmt, FORMATS, where="prepare_image_folder")
    base = paths.data_dir() / "image_folders"
    if root is None and source != "synthetic":
        real_done = base / f"cifar10_real_{fmt}_{n}" / _DONE
        if real_done.exists():
            return real_done.parent, False
    if root is None and source != "real" and not data._real_present("cifar10", paths.data_dir()):
        syn_done = base / f"cifar10_synthetic_{fmt}_{n}" / _DONE
        if syn_done.exists() and (source == "synthetic" or not data.online(
                torchvision.datasets.CIFAR10.url, timeout=1.0)):
            return syn_done.parent, True
    ds = data.cifar10(train=True, source=source)
    if n > len(ds):
        raise ValueError(f"n must be at most the data set's size ({len(ds)}), got {n}")
    kind = "synthetic" if ds.synthetic else "real"
    folder = Path(root) if root is not None else base / f"cifar10_{kind}_{fmt}_{n}"
    done = folder / _DONE
    if done.exists():
        return folder, ds.synthetic
    x, y = data.as_tensors(ds, limit=n)
    classes = getattr(ds, "classes", None) or synthetic.CIFAR_CLASSES
    synthetic.write_image_folder(folder, x.permute(0, 2, 3, 1).numpy(), y.numpy(), list(classes),
                                 fmt=fmt, quality=quality)
    paths.write_atomic(done, json.dumps({"n": n, "fmt": fmt, "synthetic": ds.synthetic,
                                         "written": time.strftime("%Y-%m-%dT%H:%M:%S")}))
    return folder, ds.synthetic


def folder_bytes(root: str | Path) -> int:
    """Total size of the image files under `root` (what a RAM disk would have to hold)."""
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.suffix in (".png", ".jpg"))


# ----------------------------------------------------------------------------- data set + transforms

def cifar_train_transform(*, pad: int = 4, crop: int = 32, flip: bool = True,
                          mean: tuple[float, ...] = CIFAR_MEAN,
                          std: tuple[float, ...] = CIFAR_STD) -> T.Compose:
    """The classic CIFAR-10 training recipe on a decoded PIL image: pad + random crop, random
    horizontal flip, to float tensor, normalise. torchvision classes, so it pickles for `spawn`."""
    check_int("crop", crop, where="cifar_train_transform")
    check_int("pad", pad, 0, where="cifar_train_transform")
    steps: list = [T.RandomCrop(crop, padding=pad)]
    if flip:
        steps.append(T.RandomHorizontalFlip())
    steps += [T.ToTensor(), T.Normalize(mean, std)]
    return T.Compose(steps)


def image_folder(root: str | Path, transform=None) -> torchvision.datasets.ImageFolder:
    """torchvision's ImageFolder over `root`, with a clear error when the path does not exist."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"root: the image folder {str(root)!r} does not exist (or is not a directory); "
            "write one with helpers.pipelines.prepare_image_folder()")
    # allow_empty: a small sample may miss a class; the folder for it still fixes the label ids
    return torchvision.datasets.ImageFolder(str(root), transform=transform, allow_empty=True,
                                            loader=load_image)


def load_image(path: str) -> Image.Image:
    """torchvision's default PIL loader, but a damaged file (truncated copy, not an image) is
    named in the error: PIL's own message ('image file is truncated') does not say which file.
    Module level, so it pickles for `spawn` workers."""
    try:
        with open(path, "rb") as f:
            img = Image.open(f)
            return img.convert("RGB")
    except (OSError, SyntaxError, ValueError) as e:
        raise RuntimeError(f"image file {path} cannot be decoded ({e}); it is truncated or not an "
                           "image: write the folder again (prepare_image_folder) or delete the file") from e


class PerSampleTensorDataset(Dataset):
    """The data set held in memory as one uint8 tensor (N, C, H, W); a per-sample `transform`
    (torchvision v2 on tensors) runs on each image as it is fetched: no file, no decode."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, transform=None) -> None:
        if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4:
            raise ValueError("x must be a uint8 tensor of shape (N, C, H, W)")
        if len(x) != len(y):
            raise ValueError(f"x and y must have the same length, got {len(x)} and {len(y)}")
        self.x, self.y, self.transform = x, y, transform

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        img = self.x[i]
        return (self.transform(img) if self.transform is not None else img), self.y[i]


def tensor_train_transform(*, pad: int = 4, crop: int = 32, flip: bool = True,
                           mean: tuple[float, ...] = CIFAR_MEAN,
                           std: tuple[float, ...] = CIFAR_STD):
    """The same recipe as `cifar_train_transform`, per sample on a uint8 tensor (torchvision v2)."""
    from torchvision.transforms import v2

    check_int("crop", crop, where="tensor_train_transform")
    check_int("pad", pad, 0, where="tensor_train_transform")
    steps: list = [v2.RandomCrop(crop, padding=pad)]
    if flip:
        steps.append(v2.RandomHorizontalFlip())
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    return v2.Compose(steps)


# ----------------------------------------------------------------------------- the loader

def make_loader(dataset: Dataset, *, batch_size: int, num_workers: int = 0, shuffle: bool = True,
                pin_memory: bool = False, prefetch_factor: int | None = None,
                persistent_workers: bool = False, multiprocessing_context: str | None = None,
                drop_last: bool = False, seed: int | None = 0) -> DataLoader:
    """A `DataLoader` whose arguments are checked here, before any worker process starts.

    `seed` fixes the shuffling order (and, through it, the workers' augmentation seeds).
    """
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(f"dataset must be a map-style Dataset, got {type(dataset).__name__}")
    check_int("batch_size", batch_size, where="make_loader")
    check_int("num_workers", num_workers, 0, where="make_loader")
    if prefetch_factor is not None:
        if num_workers == 0:
            raise ValueError(
                f"prefetch_factor={prefetch_factor!r} needs num_workers >= 1 (it is the number of "
                "batches each worker loads ahead); leave prefetch_factor=None with num_workers=0")
        check_int("prefetch_factor", prefetch_factor, where="make_loader")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers=True needs num_workers >= 1; with num_workers=0 "
                         "there is no worker to keep")
    check_choice("multiprocessing_context", multiprocessing_context, START_METHODS, where="make_loader")
    if multiprocessing_context is not None:
        if multiprocessing_context not in mp.get_all_start_methods():
            raise ValueError(f"multiprocessing_context={multiprocessing_context!r} is not available "
                             f"on this platform; available: {mp.get_all_start_methods()}")
        if num_workers == 0:
            raise ValueError("multiprocessing_context needs num_workers >= 1")
    if len(dataset) == 0:
        raise ValueError("dataset is empty")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers,
                      pin_memory=pin_memory and devices.pin_memory_useful(),
                      prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                      multiprocessing_context=multiprocessing_context, drop_last=drop_last,
                      generator=generator)


def consume(batches: Iterable, device: str | torch.device | None = None,
            limit: int | None = None, step_seconds: float = 0.0) -> int:
    """Pull every batch (moving it to `device` when given, as a training loop would); return
    the number of samples. The device is synchronised at the end so copies are counted.
    `step_seconds` sleeps after each batch, a stand-in for a training step (workers then fill
    their prefetch queues, as they do in training)."""
    if not isinstance(batches, Iterable):
        raise TypeError(f"consume: batches must be iterable (a DataLoader, a list of (x, y)), "
                        f"got {type(batches).__name__}")
    check_int("limit", limit, where="consume", allow_none=True)
    n = 0
    dev = as_device(device, "consume: device") if device is not None else None
    for i, (x, _y) in enumerate(batches):
        if dev is not None and x.device != dev:
            x = x.to(dev, non_blocking=True)
        n += len(x)
        if step_seconds:
            time.sleep(step_seconds)
        if limit is not None and i + 1 >= limit:
            break
    if dev is not None:
        devices.synchronize(dev)
    return n


# ----------------------------------------------------------------------------- JPEG copies (claim L7)

def reencode_jpeg(x: torch.Tensor, quality: int = 75) -> torch.Tensor:
    """Round-trip every image of a uint8 (N, C, H, W) batch through JPEG at `quality`: the same
    images as a JPEG copy of the data set would give after decoding."""
    from PIL import Image

    if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4:
        raise ValueError("x must be a uint8 tensor of shape (N, C, H, W)")
    if not isinstance(quality, int) or isinstance(quality, bool) or not 1 <= quality <= 100:
        raise ValueError(f"reencode_jpeg: quality must be an int in 1..100, got {quality!r}")
    arr = x.permute(0, 2, 3, 1).contiguous().numpy()
    out = np.empty_like(arr)
    for i, img in enumerate(arr):
        buf = io.BytesIO()
        Image.fromarray(img[..., 0] if img.shape[-1] == 1 else img).save(buf, format="JPEG",
                                                                          quality=quality)
        dec = np.asarray(Image.open(io.BytesIO(buf.getvalue())))
        out[i] = dec[..., None] if dec.ndim == 2 else dec
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


# ----------------------------------------------------------------------------- measuring a loader

def time_loader(dataset: Dataset, *, batch_size: int, repeats: int = 3, warmup: int = 0,
                device: str | torch.device | None = None, label: str = "",
                **loader_kwargs: object):
    """Seconds per epoch of `make_loader(dataset, ...)` (a `timing.Measurement`).

    The loader is built once, so `persistent_workers=True` keeps its workers between the
    timed epochs (and `warmup=1` then leaves their start-up out); otherwise every epoch pays
    for starting its workers, as a real training epoch does. The loader is shut down before
    returning, so no worker outlives the measurement.
    """
    if device is not None:
        as_device(device, "time_loader: device")  # a typo fails here, before any worker starts
    loader = make_loader(dataset, batch_size=batch_size, **loader_kwargs)
    try:
        return benchmark(lambda: consume(loader, device), repeats=repeats, warmup=warmup,
                         label=label or f"workers={loader_kwargs.get('num_workers', 0)}")
    finally:
        shutdown(loader)


def shutdown(loader: DataLoader) -> None:
    """Stop a loader's worker processes now (persistent workers otherwise live as long as the
    loader object does - in a notebook, until the kernel stops)."""
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    loader._iterator = None
