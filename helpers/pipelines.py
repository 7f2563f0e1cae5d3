"""The CPU image pipeline that real training code uses: files on disk -> decode -> augment -> batch.

    root, synthetic = prepare_image_folder(n=2048)           # PNGs of CIFAR-10 (or its stand-in)
    ds = image_folder(root, transform=cifar_train_transform())
    loader = DataLoader(ds, batch_size=128, num_workers=2, prefetch_factor=2)  # in the notebook

Everything a DataLoader worker runs (the data set, the transforms) is defined here, in an
importable module, so that workers also work where the start method is `spawn` (macOS,
Windows): a spawned worker re-imports what it runs, and cannot import a notebook cell. The
`DataLoader` itself is written in the notebooks; its workers end with its iterator, or, when
persistent, with the loader object (`del loader`).

`WorkerMemorySampler` measures the memory the workers really take while they load, and
`live_workers()` lists the worker processes still alive (none, once a loader is done with).
`dali_available()` and `dali_batches()`: NVIDIA DALI, which decodes and augments on the GPU
straight from the files (Linux with an NVIDIA GPU, where `nvidia-dali` is installed).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch
import torchvision
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms as T

from . import data, paths, synthetic
from .checks import check_choice, check_int, check_seconds

# Per-channel statistics of the real CIFAR-10 training set (the usual constants).
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
FORMATS = ("png", "jpeg")
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


# ----------------------------------------------------------------------------- what the workers cost
# Resident memory (RSS) counts pages a worker shares with its parent: with `fork` every worker
# starts as a copy-on-write clone of the notebook's process, so RSS overstates what workers add.
# Unique memory (USS) is what the machine gets back when a worker exits. Batches in flight live
# in shared memory, mapped by a worker and then by the parent, so only proportional memory (PSS)
# of anonymous and shared-memory pages, summed over the parent *and* its workers, sees them:
# `added_mb` is that sum (median while loading) minus the parent's PSS before loading.

MB = 2**20
_NOT_WORKERS = ("resource_tracker", "forkserver", "semaphore_tracker")


def live_workers(pid: int | None = None) -> list[psutil.Process]:
    """Child processes of `pid` (default: this process) that are alive, except the helper
    processes multiprocessing keeps for itself (resource tracker, forkserver)."""
    out = []
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for k in kids:
        try:
            if k.status() != psutil.STATUS_ZOMBIE and not any(s in " ".join(k.cmdline()) for s in _NOT_WORKERS):
                out.append(k)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def _memory(proc: psutil.Process) -> tuple[int, int, int]:
    """(rss, uss, private pss) of `proc`, in bytes: see `private_pss`."""
    info = proc.memory_full_info()
    return info.rss, info.uss, private_pss(proc.pid, fallback=getattr(info, "pss", info.uss))


@dataclass
class WorkerMemorySampler:
    """Sample the memory of this process's workers from a background thread every `interval` s."""

    interval: float = 0.05
    samples: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_seconds("interval", self.interval, where="WorkerMemorySampler")
        self._stop = threading.Event()
        self._me = psutil.Process()

    def _sample(self) -> None:
        total, n = [0, 0, 0], 0
        for w in live_workers():
            try:
                total, n = [a + b for a, b in zip(total, _memory(w), strict=True)], n + 1
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        parent_rss, _, parent_pss = _memory(self._me)
        self.samples.append(dict(zip(("rss", "uss", "pss"), total, strict=True), workers=n,
                                 parent_rss=parent_rss, parent_pss=parent_pss))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> WorkerMemorySampler:
        self.samples.clear()
        self.baseline_pss = _memory(self._me)[2]  # the parent alone, before loading
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name="worker-memory")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        """Peaks over the run, in MB: all workers together and per worker (at the peak)."""
        busy = [s for s in self.samples if s["workers"]] or [dict(workers=0, rss=0, uss=0, pss=0, parent_pss=0)]
        top_rss, top_uss = max(busy, key=lambda s: s["rss"]), max(busy, key=lambda s: s["uss"])
        most = max(s["workers"] for s in busy)
        return {
            "workers": most, "samples": len(self.samples),
            "rss_mb": top_rss["rss"] / MB, "uss_mb": top_uss["uss"] / MB,
            "rss_per_worker_mb": top_rss["rss"] / max(top_rss["workers"], 1) / MB,
            "uss_per_worker_mb": top_uss["uss"] / max(top_uss["workers"], 1) / MB,
            "parent_rss_mb": max((s["parent_rss"] for s in self.samples), default=0) / MB,
            # physical memory the loading added: parent + workers (private PSS), minus the parent
            # alone before; the median over the samples with every worker up (a sample taken while
            # a worker starts or exits splits shared pages inconsistently)
            "added_mb": (statistics.median(s["pss"] + s["parent_pss"] for s in busy if s["workers"] == most)
                         - self.baseline_pss) / MB if most else 0.0,
        }


def private_pss(pid: int, fallback: int = 0) -> int:
    """Proportional memory of `pid` in anonymous and shared-memory pages (Linux smaps_rollup:
    Pss_Anon + Pss_Shmem), in bytes.

    Unlike plain PSS this leaves out file-backed pages (PyTorch's libraries), whose shares move
    whenever *any* process on the machine maps the same file; anonymous pages after `fork` and
    the shared-memory segments that carry batches are split only between the notebook's process
    and its workers, so summed over them they give the physical memory they use. Where
    smaps_rollup lacks these fields (older kernels, macOS, Windows) returns `fallback`.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return 1024 * sum(int(fields[k].split()[0]) for k in ("Pss_Anon", "Pss_Shmem"))
    except (OSError, KeyError, ValueError):
        return fallback


# ----------------------------------------------------------------------------- NVIDIA DALI (where installed)

DALI_INSTALL_HINT = ("pip install --extra-index-url https://pypi.nvidia.com nvidia-dali-cuda120 "
                "(pick the package matching your CUDA major version; Linux with an NVIDIA GPU only)")


def dali_available() -> tuple[bool, str]:
    """(True, version) when NVIDIA DALI can be used here (Linux, a CUDA GPU, `nvidia-dali`
    installed), else (False, the reason). Nothing of DALI is imported unless this says so."""
    if not torch.cuda.is_available():
        return False, "no CUDA GPU on this machine (DALI's GPU pipeline needs one)"
    try:
        import nvidia.dali as dali  # noqa: F401
        from nvidia.dali.plugin.pytorch import DALIGenericIterator  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return False, f"nvidia-dali is not importable ({type(e).__name__}: {e}); {DALI_INSTALL_HINT}"
    return True, getattr(dali, "__version__", "unknown version")


def dali_batches(root: str | Path, *, batch_size: int, pad: int = 4, crop: int = 32,
                 mean: tuple[float, ...] = CIFAR_MEAN, std: tuple[float, ...] = CIFAR_STD,
                 seed: int = 0, num_threads: int = 2, device_id: int = 0,
                 epochs: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """`epochs` epochs of (X float32 (B, 3, crop, crop) on the GPU, y int64) from an image
    folder: GPU decode, zero pad by `pad`, random `crop` crop, random flip, normalise."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"root: the image folder {str(root)!r} does not exist")

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed)
    def pipe():
        files, labels = fn.readers.file(file_root=str(root), random_shuffle=True, name="reader")
        images = fn.decoders.image(files, device="mixed", output_type=types.RGB)
        side = crop + 2 * pad
        # paste into a zero canvas (pad on every side), then a random crop and flip
        images = fn.paste(images, ratio=side / crop, fill_value=0, paste_x=0.5, paste_y=0.5)
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW", crop=(crop, crop),
            crop_pos_x=fn.random.uniform(range=(0.0, 1.0)),
            crop_pos_y=fn.random.uniform(range=(0.0, 1.0)),
            mirror=fn.random.coin_flip(probability=0.5),
            mean=[255 * m for m in mean], std=[255 * s for s in std])
        return images, labels.gpu()

    p = pipe()
    p.build()
    it = DALIGenericIterator([p], ["x", "y"], reader_name="reader",
                             last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)
    for _ in range(epochs):
        for out in it:
            yield out[0]["x"], out[0]["y"].view(-1).long()
