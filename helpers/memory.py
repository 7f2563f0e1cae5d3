"""How much memory does a training step need? The allocator's peak on a GPU, a count elsewhere.

`peak_step_bytes(step, device)` is the one peak measure: `max_memory_allocated` where the device
has the counter, else `PeakTensorBytes`, which sees every tensor the step creates and when it
dies (a CPU's resident size mixes in the allocator's caching and the rest of the process).
`SavedTensors` records, through `torch.autograd.graph.saved_tensors_hooks`, every tensor the
forward pass saves for backward, and how many of those bytes are still alive: the activation
memory that grows with the batch, and what a forgotten graph keeps alive (claim L9).

    with SavedTensors() as saved:
        loss = loss_fn(net(X), y)
    saved.live_bytes()      # activations held by the graph of `loss`
    del loss                # ... and freed with it
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import devices


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class SavedTensors:
    """Track tensors autograd saves inside the `with` block; ask later how many bytes live on."""

    def __init__(self) -> None:
        self._refs: list[tuple[weakref.ref, int, int]] = []  # (ref, storage ptr, bytes)
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        # The graph keeps a detached alias (same storage, no grad_fn): packing `t` itself would
        # make a reference cycle output -> grad_fn -> output that Python's gc cannot see.
        held = t.detach()
        try:
            storage = held.untyped_storage()
            self._refs.append((weakref.ref(held), storage.data_ptr(), storage.nbytes()))
        except (RuntimeError, TypeError):  # e.g. tensors without storage
            pass
        return held

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def __enter__(self) -> SavedTensors:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._hooks is not None
        self._hooks.__exit__(*exc)

    def saved_bytes(self) -> int:
        """Bytes saved for backward (each storage counted once), alive or not."""
        return sum({ptr: n for _, ptr, n in self._refs}.values())

    def live_bytes(self, collect: bool = False) -> int:
        """Bytes of saved tensors that are still alive now (each storage counted once).

        Graphs are freed by reference counting as soon as the last reference goes; pass
        `collect=True` to run the (slow) cycle collector first when your code makes cycles."""
        if collect:
            gc.collect()
        return sum({ptr: n for ref, ptr, n in self._refs if ref() is not None}.values())


class PeakTensorBytes(TorchDispatchMode):
    """Peak bytes of the tensors created inside the `with` block that were alive at the same time.

    A CPU has no `torch.cuda.max_memory_allocated`, and the process's resident size mixes in the
    allocator's caching. This dispatch mode sees every operator's outputs (forward, backward and
    any recomputation), keeps a weak reference to each new storage, and after each operator adds
    up the storages still alive. Tensors that existed before the block (weights, the batch) are
    not counted: the figure is what the step itself allocates - activations, gradients and
    temporaries.

        with PeakTensorBytes() as m:
            loss_fn(net(X), y).backward()
        m.peak   # bytes
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0
        self.current = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        out = func(*args, **(kwargs or {}))
        # forget freed storages first: a new storage may reuse a freed one's address
        for key in [k for k, (ref, _) in self._live.items() if ref.expired()]:
            del self._live[key]
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                ref = StorageWeakRef(storage)
                self._live.setdefault(ref.cdata, (ref, storage.nbytes()))
        self.current = sum(n for _, n in self._live.values())
        self.peak = max(self.peak, self.current)
        return out


def peak_step_bytes(step: Callable[[], object], device: str | torch.device) -> tuple[int, str]:
    """Peak memory that `step()` allocates on top of what already exists, and how it was measured:
    the allocator's peak where the device has one (CUDA, XPU), `PeakTensorBytes` elsewhere (the
    CPU, Apple MPS). The one peak-memory measure of the suite."""
    dev = devices.as_device(device)
    if devices.has_peak_memory_counter(dev):
        devices.synchronize(dev)
        before = devices.memory_allocated(dev)
        devices.reset_peak_memory(dev)
        step()
        devices.synchronize(dev)
        return int(devices.max_memory_allocated(dev) - before), f"{dev.type} max_memory_allocated"
    with PeakTensorBytes() as m:
        step()
    return m.peak, "peak bytes of live tensors (dispatch-mode count)"
