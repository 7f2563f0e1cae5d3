"""Stand-ins for the real data sets where they cannot be downloaded (offline, CI), in the real
on-disk formats, so the real torchvision classes read them. Learnable but not trivial: a sample
is its class's random low-frequency prototype, shifted a few pixels, rescaled in contrast, with
pixel noise; a few labels are flipped, so no model reaches 100 %.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np

from .checks import check_choice, check_int

CIFAR_CLASSES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]
MARKER = "SYNTHETIC.json"


def class_images(
    n: int,
    height: int,
    width: int,
    channels: int = 1,
    *,
    num_classes: int = 10,
    seed: int = 0,
    label_noise: float = 0.05,
    noise: float = 0.35,
) -> tuple[np.ndarray, np.ndarray]:
    """`n` uint8 images (N, H, W, C) and int64 labels from class prototypes (see module doc)."""
    for name, v in (
        ("n", n),
        ("height", height),
        ("width", width),
        ("channels", channels),
        ("num_classes", num_classes),
    ):
        check_int(name, v, where="class_images")
    if not isinstance(label_noise, (int, float)) or not 0 <= label_noise < 1:
        raise ValueError(f"class_images: label_noise must be in [0, 1), got {label_noise!r}")
    if not isinstance(noise, (int, float)) or noise < 0:
        raise ValueError(
            f"class_images: noise must be a number >= 0 (pixel noise std), got {noise!r}"
        )
    # the same prototypes (seed 12345) for train and test splits; 4x4 blocks: low frequency
    protos = np.random.default_rng(12345).random(
        (num_classes, -(-height // 4), -(-width // 4), channels), dtype=np.float32
    )
    protos = protos.repeat(4, axis=1).repeat(4, axis=2)[:, :height, :width, :]
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, n)
    images = np.empty((n, height, width, channels), np.uint8)
    shifts = rng.integers(-3, 4, size=(n, 2))
    for start in range(0, n, 5000):  # chunks keep the float temporaries small
        sl = slice(start, min(n, start + 5000))
        x = protos[labels[sl]].copy()
        for dy, dx in {tuple(s) for s in shifts[sl]}:
            idx = np.nonzero((shifts[sl, 0] == dy) & (shifts[sl, 1] == dx))[0]
            x[idx] = np.roll(x[idx], (dy, dx), axis=(1, 2))
        contrast = rng.uniform(0.5, 1.0, size=(len(x), 1, 1, 1)).astype(np.float32)
        x = x * contrast + rng.normal(0, noise, size=x.shape).astype(np.float32)
        images[sl] = (np.clip(x, 0, 1) * 255).astype(np.uint8)
    flip = rng.random(n) < label_noise
    labels[flip] = rng.integers(0, num_classes, int(flip.sum()))
    return images, labels.astype(np.int64)


def _write_folder(target: Path, files: dict[str, bytes], dirs: tuple[str, ...] = ()) -> Path:
    """Write `files` (relative path -> bytes) and `dirs` as the folder `target`, so that no
    reader or second writer ever sees half a folder or half a file: a temporary folder beside
    it, renamed into place; when `target` exists already, each file renamed over its old copy,
    the marker last."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    folders = {*dirs, *(str(Path(rel).parent) for rel in files)}
    try:
        for d in folders:
            (tmp / d).mkdir(parents=True, exist_ok=True)
        for rel, data in files.items():
            (tmp / rel).write_bytes(data)
        try:
            os.rename(tmp, target)  # atomic; fails when target is a non-empty folder
            return target
        except OSError:
            pass
        for d in folders:
            (target / d).mkdir(parents=True, exist_ok=True)
        for rel in sorted(files, key=lambda r: Path(r).name == MARKER):
            os.replace(tmp / rel, target / rel)
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _idx(array: np.ndarray) -> bytes:
    """IDX (Fashion-MNIST's format): 00 00 08 <ndim>, big-endian int32 sizes, uint8 data."""
    return (
        struct.pack(f">HBB{array.ndim}I", 0, 0x08, array.ndim, *array.shape)
        + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    )


def write_fashion_mnist(root: str | Path, n_train: int = 60000, n_test: int = 10000) -> Path:
    """Write `<root>/FashionMNIST/raw/*-ubyte` as torchvision's FashionMNIST reads them."""
    check_int("n_train", n_train, where="write_fashion_mnist")
    check_int("n_test", n_test, where="write_fashion_mnist")
    files = {
        MARKER: json.dumps(
            dict(synthetic=True, dataset="FashionMNIST", n_train=n_train, n_test=n_test)
        ).encode()
    }
    for prefix, n, seed in (("train", n_train, 1), ("t10k", n_test, 2)):
        x, y = class_images(n, 28, 28, 1, seed=seed)
        files[f"raw/{prefix}-images-idx3-ubyte"] = _idx(x[..., 0])
        files[f"raw/{prefix}-labels-idx1-ubyte"] = _idx(y.astype(np.uint8))
    return _write_folder(Path(root) / "FashionMNIST", files)


# md5 of `write_cifar10`'s files at the default sizes. The reader checks batch files against
# checksums from this code, never from the data folder: a CIFAR batch is a pickle, and
# unpickling a crafted file runs its code. (tests/test_data.py checks the table.)
CIFAR_DEFAULT_MD5 = {
    "data_batch_1": "ffdf30c308ea875d5e25e578f7cad195",
    "data_batch_2": "2a0bba79e7fd4fe0577c70d1d06d0df7",
    "data_batch_3": "7dd2d984c7fed43fff35d44d5359bd4b",
    "data_batch_4": "4cc7867fbc86e0425fd0c0baceb6274a",
    "data_batch_5": "432d5018155abcf47c298298d7ccebaf",
    "test_batch": "32996eccbc8db528ee1cdcaf152cbf80",
    "batches.meta": "0284df8826f9ca46b417d2c8f86c8b23",
}
CIFAR_MAX = (50000, 10000)  # the real set's sizes; larger stand-ins are refused


def _cifar_files(n_train: int, n_test: int) -> dict[str, bytes]:
    """The stand-in's files: 5 pickled training batches, a test batch, meta."""

    def batch(name: str, images: np.ndarray, labels: np.ndarray) -> bytes:
        # CIFAR-10 stores each image as 1024 red, 1024 green, then 1024 blue bytes
        return pickle.dumps(
            {
                "batch_label": f"synthetic {name}",
                "labels": labels.tolist(),
                "data": images.transpose(0, 3, 1, 2).reshape(len(images), -1),
                "filenames": [f"synthetic_{name}_{i}.png" for i in range(len(images))],
            },
            protocol=2,
        )

    x, y = class_images(n_train, 32, 32, 3, seed=3)
    files = {
        f"data_batch_{i}": batch(f"data_batch_{i}", x[part], y[part])
        for i, part in enumerate(np.array_split(np.arange(n_train), 5), start=1)
    }
    files["test_batch"] = batch("test_batch", *class_images(n_test, 32, 32, 3, seed=4))
    files["batches.meta"] = pickle.dumps(
        {"label_names": CIFAR_CLASSES, "num_cases_per_batch": n_train // 5, "num_vis": 3072},
        protocol=2,
    )
    return files


def _check_cifar_sizes(where: str, n_train: object, n_test: object) -> None:
    check_int("n_test", n_test, where=where)
    check_int("n_train", n_train, 5, where=where)  # one image per training batch at least
    if n_train > CIFAR_MAX[0] or n_test > CIFAR_MAX[1]:
        raise ValueError(
            f"{where}: n_train and n_test must be at most {CIFAR_MAX[0]} and {CIFAR_MAX[1]} "
            f"(the real set's sizes), got {n_train} and {n_test}"
        )


def cifar10_checksums(n_train: int = 50000, n_test: int = 10000) -> dict[str, str]:
    """md5 of each file of the CIFAR-10 stand-in of these sizes, from this code alone: the
    table for the default sizes, else the files regenerated in memory."""
    _check_cifar_sizes("cifar10_checksums", n_train, n_test)
    if (n_train, n_test) == CIFAR_MAX:
        return dict(CIFAR_DEFAULT_MD5)
    return {name: hashlib.md5(b).hexdigest() for name, b in _cifar_files(n_train, n_test).items()}


def write_cifar10(root: str | Path, n_train: int = 50000, n_test: int = 10000) -> Path:
    """Write `<root>/cifar-10-batches-py/` as torchvision's CIFAR10 reads it."""
    _check_cifar_sizes("write_cifar10", n_train, n_test)
    files = _cifar_files(n_train, n_test)
    files[MARKER] = json.dumps(
        dict(synthetic=True, dataset="CIFAR10", n_train=n_train, n_test=n_test)
    ).encode()
    return _write_folder(Path(root) / "cifar-10-batches-py", files)


def write_image_folder(
    root: str | Path,
    images: np.ndarray,
    labels: np.ndarray,
    classes: list[str],
    fmt: str = "png",
    quality: int = 90,
) -> Path:
    """Write images as `<root>/<class>/<i>.<fmt>` (torchvision's ImageFolder layout), the
    folder complete or not at all."""
    from PIL import Image

    where = "write_image_folder"
    check_choice("fmt", fmt, ("png", "jpeg"), where=where)
    images, labels = np.asarray(images), np.asarray(labels)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(
            f"{where}: images must be uint8 of shape (N, H, W, 1 or 3), got "
            f"{images.dtype} {images.shape}"
        )
    if labels.shape != (len(images),):
        raise ValueError(
            f"{where}: labels must hold one label per image ({len(images)}), "
            f"got shape {labels.shape}"
        )
    if isinstance(classes, str) or not classes:
        raise ValueError(f"{where}: classes must be a non-empty list of names, got {classes!r}")
    if len(labels) and (labels.min() < 0 or labels.max() >= len(classes)):
        raise ValueError(
            f"{where}: labels must be in 0..{len(classes) - 1} (one per class name), "
            f"got {labels.min()}..{labels.max()}"
        )
    if fmt == "jpeg" and (not isinstance(quality, int) or not 1 <= quality <= 95):
        raise ValueError(f"{where}: quality must be an int in 1..95, got {quality!r}")
    files = {}
    for i, (img, lab) in enumerate(zip(images, labels, strict=True)):
        buf = io.BytesIO()
        Image.fromarray(img[..., 0] if img.shape[-1] == 1 else img).save(
            buf,
            format=fmt.upper(),
            **({"quality": quality} if fmt == "jpeg" else {"compress_level": 6}),
        )
        files[f"{classes[int(lab)]}/{i:06d}.{'png' if fmt == 'png' else 'jpg'}"] = buf.getvalue()
    return _write_folder(
        Path(root), files, dirs=tuple(classes)
    )  # every class folder, even an empty one
