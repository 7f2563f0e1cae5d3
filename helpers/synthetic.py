"""Synthetic stand-ins for the real data sets, written in the real on-disk formats.

Used only when the real data cannot be downloaded (offline machines, CI). The files are read
by the real torchvision classes, so the loading code the notebooks teach is the real one.

The images are learnable but not trivial: each class has a random low-frequency prototype;
every sample is its prototype shifted by a few pixels, rescaled in contrast, with pixel noise,
and a small fraction of labels are flipped, so no model can reach 100 % accuracy.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import struct
from pathlib import Path

import numpy as np

FASHION_CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat",
                   "sandal", "shirt", "sneaker", "bag", "ankle boot"]
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer",
                 "dog", "frog", "horse", "ship", "truck"]
MARKER = "SYNTHETIC.json"


def class_images(n: int, height: int, width: int, channels: int = 1, *, num_classes: int = 10,
                 seed: int = 0, label_noise: float = 0.05, noise: float = 0.35) -> tuple[np.ndarray, np.ndarray]:
    """`n` uint8 images (N, H, W, C) and int64 labels from class prototypes (see module doc)."""
    _positive_ints("class_images", n=n, height=height, width=width, channels=channels,
                   num_classes=num_classes)
    if not isinstance(label_noise, (int, float)) or not 0 <= label_noise < 1:
        raise ValueError(f"class_images: label_noise must be in [0, 1), got {label_noise!r}")
    if not isinstance(noise, (int, float)) or noise < 0:
        raise ValueError(f"class_images: noise must be a number >= 0 (pixel noise std), got {noise!r}")
    proto_rng = np.random.default_rng(12345)  # same prototypes for train and test splits
    lo_h, lo_w = -(-height // 4), -(-width // 4)
    protos = proto_rng.random((num_classes, lo_h, lo_w, channels), dtype=np.float32)
    protos = np.kron(protos, np.ones((1, 4, 4, 1), np.float32))[:, :height, :width, :]
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, n)
    images = np.empty((n, height, width, channels), np.uint8)
    shifts = rng.integers(-3, 4, size=(n, 2))
    for start in range(0, n, 5000):  # chunks keep the float temporaries small
        sl = slice(start, min(n, start + 5000))
        x = protos[labels[sl]].copy()
        for (dy, dx) in {tuple(s) for s in shifts[sl]}:
            idx = np.nonzero((shifts[sl, 0] == dy) & (shifts[sl, 1] == dx))[0]
            x[idx] = np.roll(x[idx], (dy, dx), axis=(1, 2))
        contrast = rng.uniform(0.5, 1.0, size=(len(x), 1, 1, 1)).astype(np.float32)
        x = x * contrast + rng.normal(0, noise, size=x.shape).astype(np.float32)
        images[sl] = (np.clip(x, 0, 1) * 255).astype(np.uint8)
    flip = rng.random(n) < label_noise
    labels[flip] = rng.integers(0, num_classes, int(flip.sum()))
    return images, labels.astype(np.int64)


def _positive_ints(where: str, minimum: int = 1, **values: object) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise ValueError(f"{where}: {name} must be an int >= {minimum}, got {v!r}")


def _write_idx(path: Path, array: np.ndarray) -> None:
    """IDX format (Fashion-MNIST's): magic 0x0000 08 <ndim>, big-endian int32 dims, uint8 data."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def _marker(folder: Path, **info: object) -> None:
    (folder / MARKER).write_text(json.dumps({"synthetic": True, **info}, indent=1))


def write_fashion_mnist(root: str | Path, n_train: int = 60000, n_test: int = 10000) -> Path:
    """Write `<root>/FashionMNIST/raw/*-ubyte` as torchvision's FashionMNIST expects them."""
    _positive_ints("write_fashion_mnist", n_train=n_train, n_test=n_test)
    raw = Path(root) / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n, seed in (("train", n_train, 1), ("t10k", n_test, 2)):
        x, y = class_images(n, 28, 28, 1, seed=seed)
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", x[..., 0])
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", y.astype(np.uint8))
    _marker(raw.parent, dataset="FashionMNIST", n_train=n_train, n_test=n_test,
            classes=FASHION_CLASSES)
    return raw.parent


def write_cifar10(root: str | Path, n_train: int = 50000, n_test: int = 10000) -> Path:
    """Write `<root>/cifar-10-batches-py/` (5 pickled training batches, a test batch, meta)."""
    _positive_ints("write_cifar10", n_test=n_test)
    _positive_ints("write_cifar10", minimum=5, n_train=n_train)  # one image per training batch at least
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    md5 = {}

    def dump(name: str, images: np.ndarray, labels: np.ndarray) -> None:
        entry = {
            "batch_label": f"synthetic {name}",
            "labels": labels.tolist(),
            # CIFAR-10 stores each image as 1024 red, 1024 green, then 1024 blue bytes.
            "data": images.transpose(0, 3, 1, 2).reshape(len(images), -1),
            "filenames": [f"synthetic_{name}_{i}.png" for i in range(len(images))],
        }
        path = folder / name
        with open(path, "wb") as f:
            pickle.dump(entry, f, protocol=2)
        md5[name] = hashlib.md5(path.read_bytes()).hexdigest()

    x, y = class_images(n_train, 32, 32, 3, seed=3)
    for i, part in enumerate(np.array_split(np.arange(n_train), 5), start=1):
        dump(f"data_batch_{i}", x[part], y[part])
    xt, yt = class_images(n_test, 32, 32, 3, seed=4)
    dump("test_batch", xt, yt)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": CIFAR_CLASSES, "num_cases_per_batch": n_train // 5,
                     "num_vis": 3072}, f, protocol=2)
    md5["batches.meta"] = hashlib.md5((folder / "batches.meta").read_bytes()).hexdigest()
    _marker(folder, dataset="CIFAR10", n_train=n_train, n_test=n_test, md5=md5,
            classes=CIFAR_CLASSES)
    return folder


def write_image_folder(root: str | Path, images: np.ndarray, labels: np.ndarray,
                       classes: list[str], fmt: str = "png", quality: int = 90) -> Path:
    """Write images as `<root>/<class>/<i>.<fmt>` files (torchvision's ImageFolder layout)."""
    from PIL import Image

    if fmt not in ("png", "jpeg"):
        raise ValueError(f"write_image_folder: fmt must be 'png' or 'jpeg', got {fmt!r}")
    images, labels = np.asarray(images), np.asarray(labels)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError("write_image_folder: images must be uint8 of shape (N, H, W, 1 or 3), got "
                         f"{images.dtype} {images.shape}")
    if labels.shape != (len(images),):
        raise ValueError(f"write_image_folder: labels must hold one label per image ({len(images)}), "
                         f"got shape {labels.shape}")
    if isinstance(classes, str) or not classes:
        raise ValueError(f"write_image_folder: classes must be a non-empty list of names, got {classes!r}")
    if len(labels) and (labels.min() < 0 or labels.max() >= len(classes)):
        raise ValueError(f"write_image_folder: labels must be in 0..{len(classes) - 1} (one per class "
                         f"name), got {labels.min()}..{labels.max()}")
    if fmt == "jpeg" and (not isinstance(quality, int) or not 1 <= quality <= 95):
        raise ValueError(f"write_image_folder: quality must be an int in 1..95, got {quality!r}")
    root = Path(root)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
    ext = "png" if fmt == "png" else "jpg"
    for i, (img, lab) in enumerate(zip(images, labels, strict=True)):
        pil = Image.fromarray(img[..., 0] if img.shape[-1] == 1 else img)
        kwargs = {"quality": quality} if fmt == "jpeg" else {"compress_level": 6}
        pil.save(root / classes[int(lab)] / f"{i:06d}.{ext}", **kwargs)
    return root


def is_synthetic(folder: str | Path) -> bool:
    if not isinstance(folder, (str, Path)):
        raise TypeError(f"is_synthetic: folder must be a path (str or Path), got {type(folder).__name__}")
    return (Path(folder) / MARKER).exists()
