"""Checkpoints that load anywhere: the `module.` prefix, `map_location`, and `weights_only`.

- A model wrapped in `nn.DataParallel` (or DDP) saves its weights as `module.<name>`; a plain
  model refuses them. `strip_module_prefix` uses PyTorch's own helper
  (`torch.nn.modules.utils.consume_prefix_in_state_dict_if_present`).
- Tensors are saved with the device they lived on; loading a GPU checkpoint on a CPU-only
  machine fails unless `map_location` says where to put them.
- `torch.load` unpickles: without `weights_only=True` a checkpoint can run any code on load.
  `load_weights` always passes `weights_only=True` (only tensors and plain containers).

`saved_as_if_on(location)` lets a CPU-only machine *write* a checkpoint tagged with a GPU
location, to show the `map_location` failure without a GPU (a demonstration, said so).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.serialization as ser
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present


def strip_module_prefix(state_dict: dict[str, Any], prefix: str = "module.") -> dict[str, Any]:
    """A copy of `state_dict` without the DataParallel/DDP `module.` prefix (no-op if absent)."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"strip_module_prefix: state_dict must be a dict, got {type(state_dict).__name__}")
    sd = dict(state_dict)
    consume_prefix_in_state_dict_if_present(sd, prefix)
    return sd


def load_weights(f: str | Path | BinaryIO, map_location: Any = "cpu") -> dict[str, Any]:
    """`torch.load` with `weights_only=True` (safe for untrusted files) and a `map_location`."""
    if isinstance(f, io.IOBase):
        f.seek(0)
    return torch.load(f, map_location=map_location, weights_only=True)


@contextlib.contextmanager
def saved_as_if_on(location: str = "cuda:0") -> Iterator[None]:
    """Inside this block `torch.save` records CPU tensors as living on `location`.

    Only for demonstrating what a GPU machine's checkpoint looks like to a CPU-only one.
    """
    if not isinstance(location, str) or not location.startswith("cuda"):
        raise ValueError(f"saved_as_if_on: location must be a CUDA location such as 'cuda:0', got {location!r}")

    def tag(obj: Any) -> str | None:
        return location if getattr(obj, "device", None) is not None and obj.device.type == "cpu" else None

    ser.register_package(1, tag, lambda obj, loc: None)
    try:
        yield
    finally:
        ser._package_registry[:] = [p for p in ser._package_registry if p[1] is not tag]
