"""Fashion-MNIST and CIFAR-10 through torchvision, with an offline fallback; `TensorBatches`.

`source="auto"` uses the real files in `data/`, downloads them when online, else writes a
synthetic stand-in in the real on-disk format under `data/synthetic/`, read by the same
torchvision class. `describe(ds)` says which, `ds.synthetic` tells code. Offline is a 2 s
connection attempt, or `FTG_OFFLINE=1`: a download never hangs.

`TensorBatches(x_uint8, y, 512, augment=to_unit_float, device="cuda")`: (X, y) batches of a
data set held as uint8 tensors, where a DataLoader was (notebooks 06, 04, 19).
`cifar_shaped(source, n)`: the normalised in-memory images notebooks 12, 11 and 13 train on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlparse

import torch
from torch.utils.data import Dataset

from . import paths, synthetic
from .checks import check_choice, check_int, check_seconds
from .devices import as_device

DATASETS = ("fashion-mnist", "cifar10")
SOURCES = ("auto", "real", "synthetic")
# Where torchvision reads each set's files; the synthetic marker lies in the first folder.
_FOLDER = {"fashion-mnist": ("FashionMNIST", "raw"), "cifar10": ("cifar-10-batches-py",)}
FILES = {
    "fashion-mnist": (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ),
    "cifar10": (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"),
}


def _dataset_class(name: str) -> type:
    """The torchvision class that reads data set `name`. torchvision is imported here, on the
    first load: importing it takes about 2 s (its models import the compiler), which the
    notebooks that never load a data set need not pay."""
    from torchvision import datasets

    return {"fashion-mnist": datasets.FashionMNIST, "cifar10": datasets.CIFAR10}[name]


def _download_url(name: str) -> str:
    """Where torchvision downloads data set `name` from (its first mirror)."""
    cls = _dataset_class(name)
    return cls.mirrors[0] if name == "fashion-mnist" else cls.url


def _check(
    name: str, source: str, train: object = True, transform: object = None, root: object = None
) -> None:
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}: valid names are {', '.join(DATASETS)}")
    check_choice("source", source, SOURCES)
    if not isinstance(train, bool):
        raise TypeError(f"train must be True (training split) or False (test split); got {train!r}")
    if transform is not None and not callable(transform):
        raise TypeError(
            f"transform must be callable (e.g. transforms.ToTensor()) or None; got {transform!r}"
        )
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(
            f"root must be a folder path (str or Path) or None; got {type(root).__name__}"
        )


def _folder(name: str, root: Path) -> Path:
    return root.joinpath(*_FOLDER[name])


def _is_synthetic(name: str, root: Path) -> bool:
    return (root / _FOLDER[name][0] / synthetic.MARKER).exists()


def _real_present(name: str, root: Path) -> bool:
    return (_folder(name, root) / FILES[name][0]).exists() and not _is_synthetic(name, root)


def _idx_problem(path: Path) -> str | None:
    """Why an IDX file (Fashion-MNIST's format) cannot be read, or None when it looks whole."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(16)
    nd = head[3] if len(head) >= 4 else 0
    if head[:3] != b"\0\0\x08" or not 1 <= nd <= 3 or len(head) < 4 + 4 * nd:
        return f"is not an IDX file ({size} bytes; it should start with 00 00 08 0N and its sizes)"
    expected = 4 + 4 * nd + math.prod(struct.unpack(f">{nd}I", head[4 : 4 + 4 * nd]))
    if size != expected:
        return (
            f"is truncated: {size} bytes, its header promises {expected}"
            if size < expected
            else f"is {size - expected} bytes longer than its header promises"
        )
    return None


def damaged_file(name: str, root: str | Path, *, synthetic_copy: bool = False) -> str | None:
    """The first file of data set `name` under `root` that is missing, empty, truncated or
    corrupt, as 'PATH is ...'; None when all look whole. Reads whole files (md5), so `load`
    calls it only after torchvision refused the data set."""
    _check(name, "auto", root=root)
    folder = _folder(name, Path(root))
    md5s: dict[str, str] = {}
    if name == "cifar10" and synthetic_copy:
        try:
            md5s = _synthetic_cifar_md5(folder)
        except (OSError, ValueError, KeyError, TypeError):
            return (
                f"{folder / synthetic.MARKER} is missing "
                "or not the manifest the synthetic writer leaves"
            )
    elif name == "cifar10":
        cls = _dataset_class("cifar10")
        md5s = dict((*cls.train_list, *cls.test_list)) | {cls.meta["filename"]: cls.meta["md5"]}
    for path in (folder / f for f in FILES[name]):
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size == 0:
            return f"{path} is empty (0 bytes)"
        problem = _idx_problem(path) if name == "fashion-mnist" else None
        if problem:
            return f"{path} {problem}"
        if path.name in md5s and hashlib.md5(path.read_bytes()).hexdigest() != md5s[path.name]:
            return f"{path} is truncated or corrupt (its md5 checksum does not match)"
    return None


def _open(name: str, root: Path, make: Callable[[], Dataset], *, synthetic_copy: bool) -> Dataset:
    """`make()` the torchvision data set; when it fails, say which file is at fault."""
    try:
        return make()
    except Exception as e:
        problem = damaged_file(name, root, synthetic_copy=synthetic_copy)
        if problem is None:
            raise
        fix = (
            f"delete {root / _FOLDER[name][0]} and the synthetic stand-in is written again on "
            "the next load"
            if synthetic_copy
            else "copy the real file again (or delete it to download it when online)"
        )
        raise RuntimeError(f"data set {name!r}: {problem}; {fix}.") from e


def online(url: str, timeout: float = 2.0) -> bool:
    """Can we reach the host of `url`? False at once when `FTG_OFFLINE=1`."""
    if not isinstance(url, str) or not urlparse(url).hostname:
        raise ValueError(
            f"online: url must be an http(s) URL string such as 'https://host/', got {url!r}"
        )
    check_seconds("timeout", timeout, where="online")
    if os.environ.get("FTG_OFFLINE", "") not in ("", "0"):
        return False
    parsed = urlparse(url)
    try:
        with socket.create_connection(
            (parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)),
            timeout=timeout,
        ):
            return True
    except OSError:
        return False


def _synthetic_cifar_md5(folder: Path) -> dict[str, str]:
    """The stand-in's checksums from the code: a batch file is a pickle, so one that does not
    match is never unpickled. The folder's manifest only says which sizes it holds."""
    manifest = json.loads((folder / synthetic.MARKER).read_text())
    return synthetic.cifar10_checksums(manifest["n_train"], manifest["n_test"])


@functools.cache
def _synthetic_cifar10_class() -> type:
    """The real CIFAR10 reader (it checks a file's md5 before unpickling it), with the stand-in's
    md5s; built on first use, as torchvision is imported."""

    class SyntheticCIFAR10(_dataset_class("cifar10")):
        def __init__(self, root: str, **kwargs: object) -> None:
            md5 = _synthetic_cifar_md5(Path(root) / self.base_folder)
            self.train_list = [[n, md5[n]] for n, _ in type(self).train_list]
            self.test_list = [[n, md5[n]] for n, _ in type(self).test_list]
            self.meta = {**type(self).meta, "md5": md5["batches.meta"]}
            super().__init__(root, **kwargs)

    return SyntheticCIFAR10


def load(
    name: str,
    train: bool = True,
    *,
    transform: Callable | None = None,
    source: str = "auto",
    root: str | Path | None = None,
) -> Dataset:
    """The torchvision data set `name` ('fashion-mnist' or 'cifar10'); see the module doc."""
    _check(name, source, train, transform, root)
    root = Path(root) if root is not None else paths.data_dir()
    cls, kw = _dataset_class(name), dict(train=train, transform=transform)
    have = source != "synthetic" and _real_present(name, root)
    if have or (source != "synthetic" and online(_download_url(name))):
        ds = (
            _open(name, root, lambda: cls(str(root), download=False, **kw), synthetic_copy=False)
            if have
            else cls(str(root), download=True, **kw)
        )
        ds.synthetic = False
        return ds
    if source == "real":
        raise RuntimeError(
            f"data set {name!r}: {_folder(name, root) / FILES[name][0]} is missing (the real files "
            f"are not in {root}) and the download host is unreachable (offline?). Copy the files "
            "there, or use source='auto' or 'synthetic'."
        )
    syn = root / "synthetic"
    if not _is_synthetic(name, syn):
        (synthetic.write_fashion_mnist if name == "fashion-mnist" else synthetic.write_cifar10)(syn)
    syn_cls = cls if name == "fashion-mnist" else _synthetic_cifar10_class()
    ds = _open(name, syn, lambda: syn_cls(str(syn), download=False, **kw), synthetic_copy=True)
    ds.synthetic = True
    return ds


def fashion_mnist(train: bool = True, **kwargs: object) -> Dataset:
    return load("fashion-mnist", train, **kwargs)


def cifar10(train: bool = True, **kwargs: object) -> Dataset:
    return load("cifar10", train, **kwargs)


def describe(ds: Dataset) -> str:
    """'FashionMNIST train, 60000 images - SYNTHETIC DATA (...)', for notebook output."""
    if not isinstance(ds, Dataset) or not hasattr(ds, "__len__"):
        raise TypeError(
            f"describe: ds must be a data set from helpers.data.load(), got {type(ds).__name__}"
        )
    kind = type(ds).__name__.lstrip("_").replace("Synthetic", "")
    text = f"{kind} {'train' if getattr(ds, 'train', True) else 'test'}, {len(ds)} images"
    if getattr(ds, "synthetic", False):
        return text + (
            " - SYNTHETIC DATA (offline stand-in in the real file format; "
            "accuracies are not comparable to the real data set)"
        )
    return text + " - real data"


def as_tensors(ds: Dataset, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole data set as one uint8 tensor (N, C, H, W) and int64 labels, without transforms."""
    if not (hasattr(ds, "data") and hasattr(ds, "targets")):
        raise TypeError(
            "as_tensors: ds must be a data set from helpers.data.load() (a torchvision "
            f"FashionMNIST or CIFAR10 with .data and .targets), got {type(ds).__name__}"
        )
    x = torch.as_tensor(ds.data)
    x = (
        x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
    )  # Fashion-MNIST (N, H, W), CIFAR (N, H, W, C)
    y = torch.as_tensor(ds.targets, dtype=torch.int64)
    if check_int("limit", limit, where="as_tensors", allow_none=True) is not None:
        x, y = x[:limit], y[:limit]
    return x.contiguous(), y


# The two sources of notebooks 12, 11 and 13: CIFAR-10, or CIFAR-shaped synthetic images.
CIFAR_SHAPED_SOURCES = ("cifar10", "synthetic.class_images")


class CifarShaped(NamedTuple):
    """Normalised float32 images (N, 3, 32, 32) and int64 labels in host memory, and what they
    are: `name` and `synthetic` for `Recorder.data_source`, `description` for the output."""

    x: torch.Tensor
    y: torch.Tensor
    name: str
    synthetic: bool
    description: str


def cifar_shaped(source: str, n: int) -> CifarShaped:
    """The first `n` CIFAR-10 training images (`source="cifar10"`; the labelled stand-in offline),
    or `n` synthetic class images of that shape, as `(x / 255 - 0.5) / 0.25`. Notebooks 12, 11
    and 13 time a ResNet on the same data held in memory: this is their data, written once
    (their lessons are the precision, the fp32 paths and the compiler, not loading images)."""
    check_choice("source", source, CIFAR_SHAPED_SOURCES, where="cifar_shaped")
    check_int("n", n, where="cifar_shaped")
    if source == "cifar10":
        ds = cifar10(train=True)
        x, y = as_tensors(ds, limit=n)
        name, is_synthetic, description = "cifar10", bool(ds.synthetic), describe(ds)
    else:
        images, labels = synthetic.class_images(n, 32, 32, 3, seed=0)
        x, y = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(labels)
        name, is_synthetic = "synthetic CIFAR-shaped images", True
        description = f"{n} SYNTHETIC CIFAR-shaped images (class prototypes + noise), in memory"
    x = x.float().div(255).sub(0.5).div(0.25)
    return CifarShaped(x, y, name, is_synthetic, description)


# ----------------------------------------------------------------------------- TensorBatches


def to_unit_float(x: torch.Tensor) -> torch.Tensor:
    """uint8 -> float32 in [0, 1]: exactly `ToTensor()`'s values, in one batch op."""
    return x.float().div_(255)


class TensorBatches:
    """Re-iterable (X, y) batches from uint8 tensors: each `iter()` is one epoch, shuffled from
    `seed + epoch number` where the data lives. `mode="device"` moves the data set to `device`
    once (a batch is one gather there); `mode="memory"` keeps it in host memory and copies each
    uint8 batch (4x fewer bytes than float32) to `device`, where `augment` converts it.

    `staging` (memory mode; default on CUDA) gathers each batch into one of two reusable pinned
    buffers, so `non_blocking=True` really is asynchronous (`x[sel]` is pageable memory, which
    CUDA copies synchronously). A buffer is reused once an event says its copy finished.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        *,
        augment: Callable[[torch.Tensor], torch.Tensor] | None = None,
        device: str | torch.device | None = None,
        mode: str = "device",
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        staging: bool | None = None,
    ) -> None:
        if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4:
            got = (
                f"{x.dtype} tensor of shape {tuple(x.shape)}"
                if isinstance(x, torch.Tensor)
                else type(x).__name__
            )
            raise ValueError(
                f"TensorBatches: x must be a uint8 tensor of shape (N, C, H, W), got {got}"
            )
        if not isinstance(y, torch.Tensor) or len(y) != len(x):
            raise ValueError(
                f"TensorBatches: y must be a tensor with one label per image ({len(x)}), "
                f"got {len(y) if isinstance(y, torch.Tensor) else type(y).__name__}"
            )
        self.batch_size = check_int("batch_size", batch_size, where="TensorBatches")
        self.mode = check_choice("mode", mode, ("device", "memory"), where="TensorBatches")
        self.device = as_device(device, "TensorBatches: device")
        self.x, self.y = (x.to(self.device), y.to(self.device)) if mode == "device" else (x, y)
        self.augment, self.shuffle, self.seed, self.epoch = augment, shuffle, seed, 0
        self.drop_last = drop_last and len(x) >= batch_size  # never an epoch of no batches
        staging = self.device.type == "cuda" if staging is None else bool(staging)
        pin = self.device.type == "cuda" and torch.cuda.is_available()
        # two [x buffer, y buffer, event of the copy that last read them]
        self._bufs = (
            [
                [
                    torch.empty((batch_size, *t.shape[1:]), dtype=t.dtype, pin_memory=pin)
                    for t in (x, y)
                ]
                + [None]
                for _ in range(2)
            ]
            if mode == "memory" and staging
            else []
        )

    def __len__(self) -> int:
        n = len(self.x)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n, where = len(self.x), self.x.device
        g = torch.Generator(device=where).manual_seed(self.seed + self.epoch)
        order = (
            torch.randperm(n, device=where, generator=g)
            if self.shuffle
            else torch.arange(n, device=where)
        )
        self.epoch += 1
        return self._batches(order[: len(self) * self.batch_size])

    def _batches(self, order: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i, sel in enumerate(order.split(self.batch_size)):
            if not self._bufs:  # device mode: a gather there; memory mode: a plain copy
                xb, yb = (t[sel].to(self.device, non_blocking=True) for t in (self.x, self.y))
            else:
                buf = self._bufs[i % 2]
                if buf[2] is not None:
                    buf[2].synchronize()  # the copy that last read this buffer has finished
                xs, ys = buf[0][: len(sel)], buf[1][: len(sel)]
                torch.index_select(self.x, 0, sel, out=xs)
                torch.index_select(self.y, 0, sel, out=ys)
                # copy=True: on a CPU `.to` would hand out the buffer, overwritten two batches on
                xb, yb = (t.to(self.device, non_blocking=True, copy=True) for t in (xs, ys))
                if self.device.type == "cuda":
                    buf[2] = torch.cuda.Event()
                    buf[2].record()  # on the current stream, after both copies
            yield (self.augment(xb) if self.augment is not None else xb), yb
