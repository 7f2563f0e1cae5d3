"""Fashion-MNIST and CIFAR-10 through torchvision, with an offline fallback.

`source="auto"` (the default) uses the real data set when its files are in `data/`, downloads
it when the machine is online, and otherwise writes a synthetic stand-in in the real on-disk
format under `data/synthetic/` and reads it with the same torchvision class. Whatever the
source, `describe(ds)` says which, and `ds.synthetic` tells code.

Offline is detected by a quick connection attempt (2 s at most) to the data set's mirror, or
forced with `FTG_OFFLINE=1`; a download is never attempted when it would hang.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import torch
import torchvision
from torch.utils.data import Dataset

from . import paths, synthetic

DATASETS = ("fashion-mnist", "cifar10")
SOURCES = ("auto", "real", "synthetic")


def _check(name: str, source: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}: valid names are {', '.join(DATASETS)}")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}; got {source!r}")


def online(url: str, timeout: float = 2.0) -> bool:
    """Can we reach the host of `url`? False at once when `FTG_OFFLINE=1`."""
    if os.environ.get("FTG_OFFLINE", "") not in ("", "0"):
        return False
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


class _SyntheticCIFAR10(torchvision.datasets.CIFAR10):
    """The real CIFAR10 reader; only the md5 checksums come from the synthetic files' manifest."""

    def __init__(self, root: str, **kwargs: object) -> None:
        manifest = json.loads((Path(root) / self.base_folder / synthetic.MARKER).read_text())
        self.train_list = [[n, manifest["md5"][n]] for n, _ in type(self).train_list]
        self.test_list = [[n, manifest["md5"][n]] for n, _ in type(self).test_list]
        self.meta = {**type(self).meta, "md5": manifest["md5"]["batches.meta"]}
        super().__init__(root, **kwargs)


def _real_present(name: str, root: Path) -> bool:
    if name == "fashion-mnist":
        raw = root / "FashionMNIST" / "raw"
        return (raw / "train-images-idx3-ubyte").exists() and not synthetic.is_synthetic(raw.parent)
    folder = root / "cifar-10-batches-py"
    return (folder / "test_batch").exists() and not synthetic.is_synthetic(folder)


def _synthetic_present(name: str, root: Path) -> bool:
    folder = root / ("FashionMNIST" if name == "fashion-mnist" else "cifar-10-batches-py")
    return synthetic.is_synthetic(folder)


def load(name: str, train: bool = True, *, transform: Callable | None = None,
         source: str = "auto", root: str | Path | None = None) -> Dataset:
    """The torchvision data set `name` ('fashion-mnist' or 'cifar10'); see the module doc."""
    _check(name, source)
    root = Path(root) if root is not None else paths.data_dir()
    cls = torchvision.datasets.FashionMNIST if name == "fashion-mnist" else torchvision.datasets.CIFAR10
    if source != "synthetic":
        have = _real_present(name, root)
        if not have and online(cls.mirrors[0] if hasattr(cls, "mirrors") else cls.url):
            ds = cls(str(root), train=train, transform=transform, download=True)
            have = True
        elif have:
            ds = cls(str(root), train=train, transform=transform, download=False)
        if have:
            ds.synthetic = False
            return ds
        if source == "real":
            raise RuntimeError(
                f"data set {name!r}: the real files are not in {root} and the download host is "
                "unreachable (offline?). Copy the files there, or use source='auto'/'synthetic'."
            )
    syn_root = root / "synthetic"
    if not _synthetic_present(name, syn_root):
        (synthetic.write_fashion_mnist if name == "fashion-mnist" else synthetic.write_cifar10)(syn_root)
    if name == "fashion-mnist":
        ds = torchvision.datasets.FashionMNIST(str(syn_root), train=train, transform=transform,
                                               download=False)
    else:
        ds = _SyntheticCIFAR10(str(syn_root), train=train, transform=transform, download=False)
    ds.synthetic = True
    return ds


def fashion_mnist(train: bool = True, **kwargs: object) -> Dataset:
    return load("fashion-mnist", train, **kwargs)


def cifar10(train: bool = True, **kwargs: object) -> Dataset:
    return load("cifar10", train, **kwargs)


def describe(ds: Dataset) -> str:
    """'Fashion-MNIST train, 60000 images (SYNTHETIC stand-in: ...)' for notebook output."""
    kind = type(ds).__mro__[0].__name__.lstrip("_").replace("Synthetic", "")
    split = "train" if getattr(ds, "train", True) else "test"
    text = f"{kind} {split}, {len(ds)} images"
    if getattr(ds, "synthetic", False):
        text += (" - SYNTHETIC DATA (offline stand-in in the real file format; "
                 "accuracies are not comparable to the real data set)")
    else:
        text += " - real data"
    return text


def as_tensors(ds: Dataset, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole data set as one uint8 tensor (N, C, H, W) and int64 labels, without transforms."""
    data = ds.data
    x = torch.as_tensor(data)
    if x.ndim == 3:  # Fashion-MNIST: (N, H, W)
        x = x.unsqueeze(1)
    else:  # CIFAR-10: (N, H, W, C) numpy
        x = x.permute(0, 3, 1, 2)
    y = torch.as_tensor(ds.targets, dtype=torch.int64)
    if limit is not None:
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"as_tensors: limit must be a positive int, got {limit!r}")
        x, y = x[:limit], y[:limit]
    return x.contiguous(), y
