"""A dispatch-level counter: the ops a step dispatches, the ones that synchronise, the hot ops'
dtypes and memory formats. It roughly doubles a tiny step's time, so it runs on a short window
whose steps are in no timing.

What it can see: every aten op below autograd, forward and backward. On a CPU, `.item()`,
`float(t)`, `bool(t)` (all `aten._local_scalar_dense`) and `nonzero`; `.cpu()`, `.tolist()`,
`.numpy()` of a CPU tensor run no op and are invisible, and `print(t)` runs its ops with
dispatch modes switched off. On a GPU, copies from the
device to the host are ops too, and counted; so are copies from the host to a CUDA device that
make the host wait as well: from pageable (not pinned) memory, where CUDA stages the data and
synchronises, or with non_blocking=False, where PyTorch synchronises after the copy
(https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # the documented home of modes

from .rules import UPLOAD

# Ops that make the host wait for the device: a value read on the host, or a result whose size
# depends on the data (nonzero, masked_select, unique).
SYNC_OPS = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "unique_consecutive",
    "_unique2",
    "repeat_interleave",
}
# Devices whose copies from the host wait for the device unless pinned and non_blocking (CUDA's
# rule; MPS shares memory with the host). A test puts "meta" here to stand in for a CUDA GPU.
UPLOAD_SYNCS = {"cuda"}
# The ops that do the arithmetic of a training step: their dtype and layout decide its speed.
HOT_OPS = {
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "convolution",
    "convolution_backward",
    "_convolution",
    "mkldnn_convolution",
    "cudnn_convolution",
}


# Where a sync comes from: the innermost frame outside the doctor and outside torch's own
# plumbing between a call and its op (Tensor methods, formatting, dispatch) is the code that
# asked for it; a frame in torch or another installed package makes it a library's sync.
_DOCTOR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_PLUMBING = {
    "_tensor.py",
    "_tensor_str.py",
    "_ops.py",
    "overrides.py",
    "_python_dispatch.py",
    "eval_frame.py",  # torch._disable_dynamo, which wraps a dispatch mode's entry
    "_compile.py",
}
_INSTALLED = tuple(
    {sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)


def sync_site() -> tuple[str, str | None]:
    """(the user's code that led to the sync as "file:line", the library it happened in or
    None when the user's own line asked for it). Python frames only: a C++ caller is unseen."""
    library = None
    f = sys._getframe(1)  # documented in the sys module; frames are what attribution needs
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if path.startswith(_DOCTOR):
            pass
        elif path.startswith(_TORCH):
            if library is None and os.path.basename(path) not in _PLUMBING:
                library = f.f_globals.get("__name__", "torch")
        elif path.startswith(_INSTALLED):
            library = library or f.f_globals.get("__name__", "a library")
        else:
            return f"{os.path.basename(path)}:{f.f_lineno}", library
        f = f.f_back
    return "?", library


def _name(func: object) -> str:
    return str(func.__name__).split(".")[0] if hasattr(func, "__name__") else str(func)


def _layout(t: torch.Tensor) -> str:
    if (
        t.dim() == 4
        and not t.is_contiguous()
        and t.is_contiguous(memory_format=torch.channels_last)
    ):
        return "channels_last"
    return "contiguous" if t.is_contiguous() else "strided"


class OpCounter(TorchDispatchMode):
    """Counts what passes the dispatcher while `paused` is False (the in-notebook form pauses
    it while the loader makes a batch: those ops are data loading, not the step)."""

    def __init__(self, device: torch.device | None = None) -> None:
        super().__init__()
        self.device = device
        self.ops = 0
        self.syncs: Counter[str] = Counter()
        self.sites: Counter[tuple[str, str | None]] = Counter()  # (user line, library)
        self.hot: Counter[str] = Counter()
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.paused:
            self._count(func, args, kwargs or {})
        return out

    def _count(self, func: object, args: tuple, kwargs: dict) -> None:
        name = _name(func)
        if name.startswith("_record_function"):  # the profiler's own marks
            return
        self.ops += 1
        copy = _sync_copy(name, args, kwargs)
        if name in SYNC_OPS or copy is not None:
            self.syncs[copy or name] += 1
            self.sites[sync_site()] += 1
        if name in HOT_OPS:
            t = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if t is not None:
                self.hot[f"{name} {str(t.dtype).removeprefix('torch.')} {_layout(t)}"] += 1


def _sync_copy(name: str, args: tuple, kwargs: dict) -> str | None:
    """How a copy synchronises the host with the device, as the counter names it, or None: a
    copy to the host (`.cpu()`, `.numpy()` of a GPU tensor) always; a copy to a CUDA device
    (`.to(device)`, `dst.copy_(src)`) from pageable memory or with non_blocking=False."""
    if name == "_to_copy" and args and isinstance(args[0], torch.Tensor):
        src, dst = args[0], kwargs.get("device")
        dst = torch.device(dst) if dst is not None else src.device
        non_blocking = bool(kwargs.get("non_blocking", False))
    elif name == "copy_" and len(args) > 1 and all(isinstance(a, torch.Tensor) for a in args[:2]):
        src, dst = args[1], args[0].device
        non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    else:
        return None
    if src.device.type != "cpu" and dst.type == "cpu":
        return f"{name} device->host"
    if src.device.type == "cpu" and dst.type in UPLOAD_SYNCS:
        if not src.is_pinned():
            return f"{name} {UPLOAD}, pageable"
        if not non_blocking:
            return f"{name} {UPLOAD}, non_blocking=False"
    return None
