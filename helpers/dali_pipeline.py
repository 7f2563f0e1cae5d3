"""NVIDIA DALI, when it is installed and a GPU is present: decode + augment on the GPU.

DALI (`pip install nvidia-dali-cuda120`, or the wheel matching your CUDA; Linux + NVIDIA GPU
only) reads the image files, decodes them on the GPU (`device="mixed"`) and pads, crops,
flips and normalises there, feeding PyTorch through `DALIGenericIterator`. Nothing here is
imported unless `available()` says so, and the notebook treats any failure as "not available",
so a missing or broken DALI never breaks it.

    ok, why = available()
    if ok:
        for X, y in dali_batches(root, batch_size=256, ...): ...
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from .pipelines import CIFAR_MEAN, CIFAR_STD

INSTALL_HINT = ("pip install --extra-index-url https://pypi.nvidia.com nvidia-dali-cuda120 "
                "(pick the package matching your CUDA major version; Linux with an NVIDIA GPU only)")


def available() -> tuple[bool, str]:
    """(True, version) when DALI can be used here, else (False, the reason)."""
    if not torch.cuda.is_available():
        return False, "no CUDA GPU on this machine (DALI's GPU pipeline needs one)"
    try:
        import nvidia.dali as dali  # noqa: F401
        from nvidia.dali.plugin.pytorch import DALIGenericIterator  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return False, f"nvidia-dali is not importable ({type(e).__name__}: {e}); {INSTALL_HINT}"
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
