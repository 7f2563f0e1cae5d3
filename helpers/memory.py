"""How much memory does a training step need? Exact on a GPU, a careful count on a CPU.

On a GPU `torch.cuda.max_memory_allocated` is the answer. A CPU has no such counter (the
process's resident size mixes in the allocator's caching and everything else the process
holds), so on a CPU we count what autograd keeps: `SavedTensors` records, through
`torch.autograd.graph.saved_tensors_hooks`, every tensor the forward pass saves for the
backward pass, and tells how many of those bytes are still alive. That is the activation
memory that grows with the batch size, and it is what a forgotten graph keeps alive (claim L9).

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
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import devices
from .checks import check_int


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


def model_bytes(net: nn.Module) -> int:
    """Parameters and buffers."""
    return sum(tensor_bytes(p) for p in net.parameters()) + sum(tensor_bytes(b) for b in net.buffers())


def step_memory(net: nn.Module, X: torch.Tensor, y: torch.Tensor,
                loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                *, optimizer_state_copies: int = 0) -> dict[str, int | str]:
    """Memory of one forward+backward step of `net` on the batch `(X, y)`.

    On CUDA: the measured peak of `max_memory_allocated`. On a CPU: an itemised count -
    parameters and buffers + gradients (one copy of the parameters) + `optimizer_state_copies`
    more copies (1 for SGD with momentum, 2 for Adam) + the input batch + the activations
    autograd saved. Returns a dict with `peak_bytes` and how it was obtained (`method`).
    """
    check_int("optimizer_state_copies", optimizer_state_copies, 0, where="step_memory")
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    dev = X.device
    params = sum(tensor_bytes(p) for p in net.parameters())
    if devices.has_peak_memory_counter(dev):  # CUDA, XPU; MPS and the CPU count instead
        devices.synchronize(dev)
        devices.reset_peak_memory(dev)
        loss = loss_fn(net(X), y)
        loss.backward()
        devices.synchronize(dev)
        peak = devices.max_memory_allocated(dev)
        net.zero_grad(set_to_none=True)
        return {"peak_bytes": peak, "method": f"{dev.type} max_memory_allocated"}
    with SavedTensors() as saved:
        loss = loss_fn(net(X), y)
    activations = saved.saved_bytes()
    loss.backward()
    net.zero_grad(set_to_none=True)
    peak = (model_bytes(net) + params * (1 + optimizer_state_copies) + tensor_bytes(X)
            + tensor_bytes(y) + activations)
    return {"peak_bytes": int(peak), "activation_bytes": int(activations),
            "method": "cpu count: model + grads + optimizer state + batch + saved activations"}


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
    the CUDA allocator's peak on a GPU, `PeakTensorBytes` elsewhere."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        step()
        torch.cuda.synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev) - before), "cuda max_memory_allocated"
    with PeakTensorBytes() as m:
        step()
    return m.peak, "peak bytes of live tensors (dispatch-mode count)"
