"""Fashion-MNIST and CIFAR-10 through torchvision, with an offline fallback.

`source="auto"` (the default) uses the real data set when its files are in `data/`, downloads
it when the machine is online, and otherwise writes a synthetic stand-in in the real on-disk
format under `data/synthetic/` and reads it with the same torchvision class. Whatever the
source, `describe(ds)` says which, and `ds.synthetic` tells code.

Offline is detected by a quick connection attempt (2 s at most) to the data set's mirror, or
forced with `FTG_OFFLINE=1`; a download is never attempted when it would hang.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import torch
import torchvision
from torch.utils.data import Dataset

from . import paths, synthetic
from .checks import check_choice, check_int, check_seconds

DATASETS = ("fashion-mnist", "cifar10")
SOURCES = ("auto", "real", "synthetic")


# The files torchvision reads, per data set (relative to the data set's folder).
FILES = {
    "fashion-mnist": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                      "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    "cifar10": (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"),
}


def _check(name: str, source: str, train: object = True, transform: object = None,
           root: object = None) -> None:
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}: valid names are {', '.join(DATASETS)}")
    check_choice("source", source, SOURCES)
    if not isinstance(train, bool):
        raise TypeError(f"train must be True (training split) or False (test split); got {train!r}")
    if transform is not None and not callable(transform):
        raise TypeError(f"transform must be callable (e.g. transforms.ToTensor()) or None; got {transform!r}")
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a folder path (str or Path) or None; got {type(root).__name__}")


def _folder(name: str, root: Path) -> Path:
    """The folder holding the data set's files, as torchvision lays them out."""
    return root / "FashionMNIST" / "raw" if name == "fashion-mnist" else root / "cifar-10-batches-py"


def _idx_problem(path: Path) -> str | None:
    """Why an IDX file (Fashion-MNIST's format) cannot be read, or None when it looks whole."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(16)
    if len(head) < 4 or head[:2] != b"\0\0" or head[2] != 0x08 or not 1 <= head[3] <= 3:
        return f"is not an IDX file ({size} bytes; it should start with 00 00 08 0N)"
    nd = head[3]
    if len(head) < 4 + 4 * nd:
        return f"is truncated inside its header ({size} bytes)"
    dims = struct.unpack(f">{nd}I", head[4:4 + 4 * nd])
    expected = 4 + 4 * nd + math.prod(dims)
    if size != expected:
        return (f"is truncated: {size} bytes, its header promises {expected}" if size < expected
                else f"is {size - expected} bytes longer than its header promises")
    return None


def diagnose(name: str, root: str | Path, *, synthetic_copy: bool = False) -> str | None:
    """The first file of data set `name` under `root` that is missing, empty, truncated or
    corrupt, as 'PATH is ...'; None when every file looks whole. Reads whole files (md5), so
    `load` calls it only after torchvision has refused the data set."""
    _check(name, "auto", root=root)
    folder = _folder(name, Path(root))
    md5s: dict[str, str] = {}
    if name == "cifar10":
        if synthetic_copy:
            manifest = folder / synthetic.MARKER
            try:
                md5s = _synthetic_cifar_md5(folder)
            except (OSError, ValueError, KeyError, TypeError):
                return f"{manifest} is missing or not the manifest the synthetic writer leaves"
        else:
            cls = torchvision.datasets.CIFAR10
            md5s = {n: m for n, m in (*cls.train_list, *cls.test_list)} | {cls.meta["filename"]: cls.meta["md5"]}
    for fname in FILES[name]:
        path = folder / fname
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size == 0:
            return f"{path} is empty (0 bytes)"
        if name == "fashion-mnist":
            problem = _idx_problem(path)
            if problem:
                return f"{path} {problem}"
        elif fname in md5s and hashlib.md5(path.read_bytes()).hexdigest() != md5s[fname]:
            return f"{path} is truncated or corrupt (its md5 checksum does not match)"
    return None


def _open(name: str, root: Path, make: Callable[[], Dataset], *, synthetic_copy: bool) -> Dataset:
    """`make()` the torchvision data set; when it fails, say which file is at fault."""
    try:
        return make()
    except Exception as e:
        problem = diagnose(name, root, synthetic_copy=synthetic_copy)
        if problem is None:
            raise
        fix = (f"delete {_folder(name, root).parent if name == 'fashion-mnist' else _folder(name, root)} "
               "and the synthetic stand-in is written again on the next load" if synthetic_copy
               else "copy the real file again (or delete it to download it when online)")
        raise RuntimeError(f"data set {name!r}: {problem}; {fix}.") from e


def online(url: str, timeout: float = 2.0) -> bool:
    """Can we reach the host of `url`? False at once when `FTG_OFFLINE=1`."""
    if not isinstance(url, str) or not urlparse(url).hostname:
        raise ValueError(f"online: url must be an http(s) URL string such as 'https://host/', got {url!r}")
    check_seconds("timeout", timeout, where="online")
    if os.environ.get("FTG_OFFLINE", "") not in ("", "0"):
        return False
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _synthetic_cifar_md5(folder: Path) -> dict[str, str]:
    """The checksums the stand-in's files must have, from the code (`synthetic.cifar10_checksums`):
    the folder's manifest only says which sizes it holds. A batch file is a pickle, so a file
    that does not match is never unpickled."""
    manifest = json.loads((folder / synthetic.MARKER).read_text())
    return synthetic.cifar10_checksums(manifest["n_train"], manifest["n_test"])


class _SyntheticCIFAR10(torchvision.datasets.CIFAR10):
    """The real CIFAR10 reader (which checks every file's md5 before unpickling it), with the
    checksums of the synthetic stand-in, which ship with this code."""

    def __init__(self, root: str, **kwargs: object) -> None:
        md5 = _synthetic_cifar_md5(Path(root) / self.base_folder)
        self.train_list = [[n, md5[n]] for n, _ in type(self).train_list]
        self.test_list = [[n, md5[n]] for n, _ in type(self).test_list]
        self.meta = {**type(self).meta, "md5": md5["batches.meta"]}
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
    _check(name, source, train, transform, root)
    root = Path(root) if root is not None else paths.data_dir()
    cls = torchvision.datasets.FashionMNIST if name == "fashion-mnist" else torchvision.datasets.CIFAR10
    if source != "synthetic":
        have = _real_present(name, root)
        if not have and online(cls.mirrors[0] if hasattr(cls, "mirrors") else cls.url):
            ds = cls(str(root), train=train, transform=transform, download=True)
            have = True
        elif have:
            ds = _open(name, root, lambda: cls(str(root), train=train, transform=transform,
                                               download=False), synthetic_copy=False)
        if have:
            ds.synthetic = False
            return ds
        if source == "real":
            missing = _folder(name, root) / FILES[name][0]
            raise RuntimeError(
                f"data set {name!r}: {missing} is missing (the real files are not in {root}) and "
                "the download host is unreachable (offline?). Copy the files there, or use "
                "source='auto' or 'synthetic'."
            )
    syn_root = root / "synthetic"
    if not _synthetic_present(name, syn_root):
        (synthetic.write_fashion_mnist if name == "fashion-mnist" else synthetic.write_cifar10)(syn_root)
    syn_cls = torchvision.datasets.FashionMNIST if name == "fashion-mnist" else _SyntheticCIFAR10
    ds = _open(name, syn_root, lambda: syn_cls(str(syn_root), train=train, transform=transform,
                                               download=False), synthetic_copy=True)
    ds.synthetic = True
    return ds


def fashion_mnist(train: bool = True, **kwargs: object) -> Dataset:
    return load("fashion-mnist", train, **kwargs)


def cifar10(train: bool = True, **kwargs: object) -> Dataset:
    return load("cifar10", train, **kwargs)


def describe(ds: Dataset) -> str:
    """'Fashion-MNIST train, 60000 images (SYNTHETIC stand-in: ...)' for notebook output."""
    if not isinstance(ds, Dataset) or not hasattr(ds, "__len__"):
        raise TypeError(f"describe: ds must be a data set from helpers.data.load(), got {type(ds).__name__}")
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
    if not (hasattr(ds, "data") and hasattr(ds, "targets")):
        raise TypeError("as_tensors: ds must be a data set from helpers.data.load() (a torchvision "
                        f"FashionMNIST or CIFAR10 with .data and .targets), got {type(ds).__name__}")
    data = ds.data
    x = torch.as_tensor(data)
    if x.ndim == 3:  # Fashion-MNIST: (N, H, W)
        x = x.unsqueeze(1)
    else:  # CIFAR-10: (N, H, W, C) numpy
        x = x.permute(0, 3, 1, 2)
    y = torch.as_tensor(ds.targets, dtype=torch.int64)
    if check_int("limit", limit, where="as_tensors", allow_none=True) is not None:
        x, y = x[:limit], y[:limit]
    return x.contiguous(), y
