"""The CPU image pipeline of real training code: files on disk -> decode -> augment -> batch:
`image_folder(prepare_image_folder()[0], transform=cifar_train_transform())` for a DataLoader.

What a DataLoader worker runs (data set, transforms) lives here, in an importable module: a
`spawn` worker (macOS, Windows) re-imports what it runs and cannot import a notebook cell.
`WorkerMemorySampler` measures what the workers take, `live_workers()` lists those alive.
`dali_batches()`: NVIDIA DALI augments on the GPU, where `nvidia-dali` is installed (built once;
one epoch per iteration).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import psutil
import torch
import torchvision
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms as T
from torchvision.transforms import v2

from . import data, paths, synthetic
from .checks import check_choice, check_int, check_seconds

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)  # per channel, over the real CIFAR-10 training set
CIFAR_STD = (0.2470, 0.2435, 0.2616)
_DONE = "COMPLETE.json"


def prepare_image_folder(
    n: int = 2048,
    *,
    fmt: str = "png",
    source: str = "auto",
    root: str | Path | None = None,
    quality: int = 90,
) -> tuple[Path, bool]:
    """Write the first `n` CIFAR-10 training images (`helpers.data.cifar10`: real, else the
    stand-in) as `<root>/<class>/<i>.<fmt>` files, once: a complete folder is reused.
    Returns the folder and whether its images are synthetic."""
    check_int("n", n, where="prepare_image_folder")
    check_choice("fmt", fmt, ("png", "jpeg"), where="prepare_image_folder")
    check_choice("source", source, data.SOURCES, where="prepare_image_folder")
    # which source `data.cifar10` will use, found without reading the data set
    real = source == "real" or (
        source == "auto"
        and (
            data._real_present("cifar10", paths.data_dir())
            or data.online(data._download_url("cifar10"), timeout=1.0)
        )
    )
    name = f"cifar10_{'real' if real else 'synthetic'}_{fmt}_{n}"
    done = (Path(root) if root is not None else paths.data_dir() / "image_folders" / name) / _DONE
    if done.exists():
        return done.parent, json.loads(done.read_text())["synthetic"]
    ds = data.cifar10(train=True, source=source)
    if n > len(ds):
        raise ValueError(f"n must be at most the data set's size ({len(ds)}), got {n}")
    x, y = data.as_tensors(ds, limit=n)
    synthetic.write_image_folder(
        done.parent,
        x.permute(0, 2, 3, 1).numpy(),
        y.numpy(),
        list(ds.classes),
        fmt=fmt,
        quality=quality,
    )
    paths.write_atomic(
        done,
        json.dumps(
            {
                "n": n,
                "fmt": fmt,
                "synthetic": ds.synthetic,
                "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        ),
    )
    return done.parent, ds.synthetic


def folder_bytes(root: str | Path) -> int:
    """Total size of the image files under `root` (what a RAM disk would have to hold)."""
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.suffix in (".png", ".jpg"))


def _recipe(
    tf: object,
    to_float: Callable,
    where: str,
    pad: int,
    crop: int,
    flip: bool,
    mean: tuple[float, ...],
    std: tuple[float, ...],
) -> Callable:
    check_int("crop", crop, where=where)
    check_int("pad", pad, 0, where=where)
    flips = [tf.RandomHorizontalFlip()] if flip else []
    return tf.Compose(
        [tf.RandomCrop(crop, padding=pad), *flips, to_float, tf.Normalize(list(mean), list(std))]
    )


def cifar_train_transform(
    *,
    pad: int = 4,
    crop: int = 32,
    flip: bool = True,
    mean: tuple[float, ...] = CIFAR_MEAN,
    std: tuple[float, ...] = CIFAR_STD,
) -> T.Compose:
    """The classic CIFAR-10 training recipe on a decoded PIL image: pad + random crop, random
    flip, to float tensor, normalise. torchvision classes, so it pickles for `spawn`."""
    return _recipe(T, T.ToTensor(), "cifar_train_transform", pad, crop, flip, mean, std)


def tensor_train_transform(
    *,
    pad: int = 4,
    crop: int = 32,
    flip: bool = True,
    mean: tuple[float, ...] = CIFAR_MEAN,
    std: tuple[float, ...] = CIFAR_STD,
) -> v2.Compose:
    """The same recipe per sample on a uint8 tensor (torchvision v2)."""
    return _recipe(
        v2,
        v2.ToDtype(torch.float32, scale=True),
        "tensor_train_transform",
        pad,
        crop,
        flip,
        mean,
        std,
    )


def image_folder(
    root: str | Path, transform: Callable | None = None
) -> torchvision.datasets.ImageFolder:
    """torchvision's ImageFolder over `root`, with a clear error when it does not exist."""
    if not Path(root).is_dir():
        raise FileNotFoundError(
            f"root: the image folder {str(root)!r} does not exist (or is not a "
            "directory); write one with helpers.pipelines.prepare_image_folder()"
        )
    # allow_empty: a small sample may miss a class; its folder still fixes the label ids
    return torchvision.datasets.ImageFolder(
        str(root), transform=transform, allow_empty=True, loader=load_image
    )


def load_image(path: str) -> Image.Image:
    """torchvision's PIL loader, naming a damaged file in the error (PIL's 'image file is
    truncated' does not). Module level, so it pickles for `spawn` workers."""
    try:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")
    except (OSError, SyntaxError, ValueError) as e:
        raise RuntimeError(
            f"image file {path} cannot be decoded ({e}); it is truncated or not an "
            "image: write the folder again (prepare_image_folder) or delete the file"
        ) from e


class PerSampleTensorDataset(Dataset):
    """The data set in memory as one uint8 tensor (N, C, H, W); `transform` (torchvision v2)
    runs on each image as it is fetched: no file, no decode."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, transform: Callable | None = None) -> None:
        if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4:
            raise ValueError("x must be a uint8 tensor of shape (N, C, H, W)")
        if len(x) != len(y):
            raise ValueError(f"x and y must have the same length, got {len(x)} and {len(y)}")
        self.x, self.y, self.transform = x, y, transform

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.transform(self.x[i]) if self.transform is not None else self.x[i]), self.y[i]


# --------------------------------------------------------------------------- what the workers cost
# RSS counts pages a worker shares with its parent (a `fork` clone), so it overstates what
# workers add; USS is what the machine gets back when a worker exits. Batches in flight live in
# shared memory, mapped by a worker then the parent: only the PSS of anonymous and shared pages,
# summed over parent and workers, sees them (`added_mb`: minus the parent's before loading).

MB = 2**20
_NOT_WORKERS = ("resource_tracker", "forkserver", "semaphore_tracker")


def live_workers(pid: int | None = None) -> list[psutil.Process]:
    """Live child processes of `pid` (default: this one), except multiprocessing's helpers."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            if k.status() != psutil.STATUS_ZOMBIE and not any(
                s in " ".join(k.cmdline()) for s in _NOT_WORKERS
            ):
                out.append(k)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def private_pss(pid: int, fallback: int = 0) -> int:
    """Pss_Anon + Pss_Shmem of `pid` in bytes (Linux smaps_rollup), else `fallback`. Unlike
    plain PSS it leaves out file-backed pages (PyTorch's libraries), whose shares move whenever
    any process maps the same file."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return 1024 * sum(int(fields[k].split()[0]) for k in ("Pss_Anon", "Pss_Shmem"))
    except (OSError, KeyError, ValueError):
        return fallback


def _memory(proc: psutil.Process) -> tuple[int, int, int]:
    info = proc.memory_full_info()
    return info.rss, info.uss, private_pss(proc.pid, fallback=getattr(info, "pss", info.uss))


class WorkerMemorySampler:
    """Sample the memory of this process's workers from a thread every `interval` s."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = check_seconds("interval", interval, where="WorkerMemorySampler")
        self.samples: list[dict] = []
        self._stop, self._me = threading.Event(), psutil.Process()

    def _run(self) -> None:
        while not self._stop.is_set():
            total, n, workers = [0, 0, 0], 0, live_workers()
            for w in workers:
                try:
                    total, n = [a + b for a, b in zip(total, _memory(w), strict=True)], n + 1
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            rss, uss, pss = total
            parent_pss = _memory(self._me)[2]
            # a worker that exited (or started) between the two reads moved the pages it shared
            # with this process into (or out of) this process's PSS: a sum that counts them twice
            # or not at all, dropped
            if {w.pid for w in live_workers()} == {w.pid for w in workers}:
                self.samples.append(
                    dict(rss=rss, uss=uss, pss=pss, workers=n, parent_pss=parent_pss)
                )
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
        busy = [s for s in self.samples if s["workers"]] or [dict(workers=0, rss=0, uss=0)]
        top = {k: max(busy, key=lambda s: s[k]) for k in ("rss", "uss")}
        most = max(s["workers"] for s in busy)
        # added: the median over samples with every worker up (one taken while a worker starts
        # or exits splits shared pages inconsistently), minus the parent alone before
        added = (
            statistics.median(s["pss"] + s["parent_pss"] for s in busy if s["workers"] == most)
            if most
            else 0
        )
        return {
            "workers": most,
            "samples": len(self.samples),
            "added_mb": (added - self.baseline_pss) / MB if most else 0.0,
            **{f"{k}_mb": top[k][k] / MB for k in top},
            **{f"{k}_per_worker_mb": top[k][k] / max(top[k]["workers"], 1) / MB for k in top},
        }


# ----------------------------------------------------------------------------- NVIDIA DALI

DALI_INSTALL_HINT = (
    "pip install --extra-index-url https://pypi.nvidia.com nvidia-dali-cuda120 "
    "(pick the package matching your CUDA major version; Linux with an NVIDIA GPU only)"
)


def dali_available() -> tuple[bool, str]:
    """(True, version) when NVIDIA DALI can run here (a CUDA GPU, `nvidia-dali` importable),
    else (False, why). Nothing of DALI is imported unless this says so."""
    if not torch.cuda.is_available():
        return False, "no CUDA GPU on this machine (DALI's GPU pipeline needs one)"
    try:
        import nvidia.dali as dali
        from nvidia.dali.plugin.pytorch import DALIGenericIterator  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return (
            False,
            f"nvidia-dali is not importable ({type(e).__name__}: {e}); {DALI_INSTALL_HINT}",
        )
    return True, getattr(dali, "__version__", "unknown version")


class DaliBatches:
    """An NVIDIA DALI pipeline, built once (`dali_batches`); each `iter()` is one epoch of
    (X float32 (B, 3, crop, crop) on the GPU, y int64). DALI's iterator resets itself at the end
    of an epoch (`auto_reset`): an epoch left early goes on where it stopped."""

    def __init__(self, iterator: Iterable) -> None:
        self.iterator = iterator

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for out in self.iterator:
            yield out[0]["x"], out[0]["y"].view(-1).long()


def dali_batches(
    root: str | Path,
    *,
    batch_size: int,
    pad: int = 4,
    crop: int = 32,
    mean: tuple[float, ...] = CIFAR_MEAN,
    std: tuple[float, ...] = CIFAR_STD,
    seed: int = 0,
    num_threads: int = 2,
    device_id: int = 0,
) -> DaliBatches:
    """An image folder as DALI batches: decode ("mixed": nvJPEG on the GPU for JPEG; PNG is
    decoded on the CPU), zero pad by `pad`, random crop, random flip, normalise. The pipeline is
    built here, once, as in training; iterate the result once per epoch."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    if not Path(root).is_dir():
        raise FileNotFoundError(f"root: the image folder {str(root)!r} does not exist")

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed)
    def pipe():
        files, labels = fn.readers.file(file_root=str(root), random_shuffle=True, name="reader")
        images = fn.decoders.image(files, device="mixed", output_type=types.RGB)
        # paste into a zero canvas (pad on every side), then a random crop and flip
        images = fn.paste(
            images, ratio=(crop + 2 * pad) / crop, fill_value=0, paste_x=0.5, paste_y=0.5
        )
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            crop=(crop, crop),
            crop_pos_x=fn.random.uniform(range=(0.0, 1.0)),
            crop_pos_y=fn.random.uniform(range=(0.0, 1.0)),
            mirror=fn.random.coin_flip(probability=0.5),
            mean=[255 * m for m in mean],
            std=[255 * s for s in std],
        )
        return images, labels.gpu()

    p = pipe()
    p.build()
    return DaliBatches(
        DALIGenericIterator(
            [p],
            ["x", "y"],
            reader_name="reader",
            last_batch_policy=LastBatchPolicy.PARTIAL,
            auto_reset=True,
        )
    )
