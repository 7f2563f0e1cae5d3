"""Training: a plain loop and evaluation, checkpoints that load anywhere, the memory a step needs.

    hist = training.train(net, batches, num_epochs=2, lr=0.1, device=device)   # hist[-1].loss
    training.evaluate(net, test_batches, device=device)     # {'loss', 'accuracy', 'samples'}

The loop is SGD on cross-entropy in fp32, for notebooks not about the loop (those about it
write theirs in cells). Loss and accuracy stay on the device until an epoch ends: every read is a
sync (notebook 08). Checkpoints (09): DataParallel/DDP save `module.<name>` keys, tensors keep the
device they were saved from (hence `map_location`), and `torch.load` unpickles, so
`load_weights` always passes `weights_only=True`. Memory (07, 10, 14): `peak_step_bytes` is the
suite's one peak measure; `SavedTensors` counts what autograd saves for backward (claim L9).
`calibration_step` is the plain step the gpu profile times to size an epoch (06, 10-13, 19).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import torch
import torch.serialization as ser
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.utils._python_dispatch import TorchDispatchMode

from . import devices
from .checks import check_choice, check_int, check_number

LR_SCHEDULES = ("constant", "linear-decay", "one-cycle")


@dataclass
class EpochStats:
    epoch: int
    loss: float
    accuracy: float
    samples: int
    seconds: float
    samples_per_s: float
    optimizer_steps: int
    lr: float


def _pairs(
    batches: Iterable, steps: int | None, device: torch.device, where: str = "train: train_iter"
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of `(X, y)` on `device`: all of `batches`, or exactly `steps`, going round
    again."""
    n = 0
    while True:
        before = n
        for batch in batches:
            try:
                X, y = batch
            except (TypeError, ValueError) as e:
                raise ValueError(
                    f"{where} must yield (X, y) pairs; got a {type(batch).__name__}"
                ) from e
            yield X.to(device, non_blocking=True), y.to(device, non_blocking=True)
            n += 1
            if steps is not None and n >= steps:
                return
        if n == before:
            raise ValueError(
                f"{where} gave no batches (a generator can only be iterated once: "
                "pass a list or a DataLoader)"
            )
        if steps is None:
            return


def _schedule(opt: torch.optim.Optimizer, name: str, lr: float, total: int | None) -> Any:
    """The learning-rate schedule over `total` updates (None: constant)."""
    if name == "constant":
        return None
    if total is None:
        raise ValueError(
            f"train: lr_schedule={name!r} needs the run's length: give steps_per_epoch "
            "or a train_iter with a len()"
        )
    if name == "linear-decay":
        return torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.0, total_iters=total)
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total)


class PassResult(NamedTuple):
    """What one pass over the data gives (`_one_pass`)."""

    loss: float  # mean cross-entropy per sample
    accuracy: float
    samples: int
    steps: int
    last_lr: float  # nan when nothing was trained


def _one_pass(
    net: nn.Module,
    pairs: Iterator,
    dev: torch.device,
    opt: torch.optim.Optimizer | None = None,
    sched: Any = None,
    bar: Any = None,
) -> PassResult:
    """One pass, training when `opt` is given. The sums stay on the device and are read once,
    at the end."""
    sum_dtype = torch.float32 if dev.type == "mps" else torch.float64  # MPS has no float64
    loss_sum = torch.zeros((), device=dev, dtype=sum_dtype)
    correct = torch.zeros((), device=dev, dtype=torch.int64)
    samples = steps = 0
    lr = float("nan")
    with torch.set_grad_enabled(opt is not None):
        for X, y in pairs:
            out = net(X)
            loss = nn.functional.cross_entropy(out, y)
            if opt is not None:
                loss.backward()
                lr = opt.param_groups[0]["lr"]
                opt.step()
                opt.zero_grad(set_to_none=True)
                if sched is not None:
                    sched.step()
                bar.update(1)
            steps, samples = steps + 1, samples + len(y)
            loss_sum += loss.detach().to(sum_dtype) * len(y)
            correct += (out.detach().argmax(dim=1) == y).sum()
    devices.synchronize(dev)
    return PassResult(
        loss_sum.item() / samples, correct.item() / samples, samples, steps, float(lr)
    )


def evaluate(
    net: nn.Module, data_iter: Iterable, *, device: str | torch.device | None = None
) -> dict[str, Any]:
    """Mean cross-entropy and accuracy of `net` on `data_iter` (no gradients, one sync)."""
    dev = devices.as_device(device)
    was_training = net.training
    net.eval()
    try:
        result = _one_pass(net, _pairs(data_iter, None, dev, "evaluate: data_iter"), dev)
    finally:
        net.train(was_training)
    return {"loss": result.loss, "accuracy": result.accuracy, "samples": result.samples}


def train(
    net: nn.Module,
    train_iter: Iterable,
    *,
    num_epochs: int = 1,
    lr: float = 0.1,
    momentum: float = 0.0,
    lr_schedule: str = "constant",
    device: str | torch.device | None = None,
    steps_per_epoch: int | None = None,
    progress: bool = True,
) -> list[EpochStats]:
    """Train `net` with SGD on cross-entropy (see the module docstring); one `EpochStats` an
    epoch."""
    dev = devices.as_device(device)
    check_int("num_epochs", num_epochs, 1, where="train")
    check_int("steps_per_epoch", steps_per_epoch, 1, where="train", allow_none=True)
    check_number("lr", lr, where="train")
    check_number("momentum", momentum, where="train", inclusive=True)
    check_choice("lr_schedule", lr_schedule, LR_SCHEDULES, where="train")
    if isinstance(train_iter, torch.Tensor) or not isinstance(train_iter, Iterable):
        raise ValueError(
            "train: train_iter must be an iterable of (X, y) batches (a DataLoader, a list, ...)"
        )
    per_epoch = steps_per_epoch or (len(train_iter) if hasattr(train_iter, "__len__") else None)
    net.to(dev).train()
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, nesterov=momentum > 0)
    sched = _schedule(opt, lr_schedule, lr, num_epochs * per_epoch if per_epoch else None)
    hist = []
    from tqdm.auto import tqdm

    with tqdm(
        total=per_epoch and per_epoch * num_epochs,
        desc="train",
        unit="batch",
        leave=False,
        disable=not progress,
    ) as bar:
        for epoch in range(1, num_epochs + 1):
            devices.synchronize(dev)
            t0 = time.perf_counter()
            r = _one_pass(net, _pairs(train_iter, steps_per_epoch, dev), dev, opt, sched, bar)
            s = time.perf_counter() - t0
            per_s = r.samples / s if s > 0 else float("inf")
            hist.append(
                EpochStats(epoch, r.loss, r.accuracy, r.samples, s, per_s, r.steps, r.last_lr)
            )
    return hist


# --- checkpoints ---------------------------------------------------------------------------


def strip_module_prefix(state_dict: dict[str, Any], prefix: str = "module.") -> dict[str, Any]:
    """A copy of `state_dict` without the DataParallel/DDP `module.` prefix (if there is one)."""
    if not isinstance(state_dict, dict):
        raise TypeError(
            f"strip_module_prefix: state_dict must be a dict, got {type(state_dict).__name__}"
        )
    sd = dict(state_dict)
    consume_prefix_in_state_dict_if_present(sd, prefix)
    return sd


def load_weights(f: str | Path | BinaryIO, map_location: Any = "cpu") -> dict[str, Any]:
    """`torch.load` with `weights_only=True` (safe for untrusted files) and a `map_location`."""
    if isinstance(f, io.IOBase):
        f.seek(0)
    return torch.load(f, map_location=map_location, weights_only=True)


_SAVE_AS: list[str] = []  # where `saved_as_if_on` says CPU storages live, while it is active


@functools.cache
def _register_tag() -> None:
    # once, on first use (never at import): torch.serialization has no way to remove a tagger,
    # so this one stays for the process, but outside `saved_as_if_on` it says None and torch's
    # own taggers decide, as if it were not there
    ser.register_package(
        1,
        lambda storage: _SAVE_AS[-1] if _SAVE_AS and storage.device.type == "cpu" else None,
        lambda storage, location: None,
    )


@contextlib.contextmanager
def saved_as_if_on(location: str = "cuda:0") -> Iterator[None]:
    """Inside this block `torch.save` records CPU tensors as living on `location`: a CPU-only
    machine can show what a GPU machine's checkpoint does to it (a demonstration, said so)."""
    if not isinstance(location, str) or not location.startswith("cuda"):
        raise ValueError(
            f"saved_as_if_on: location must be a CUDA location such as 'cuda:0', got {location!r}"
        )
    _register_tag()
    _SAVE_AS.append(location)
    try:
        yield
    finally:
        _SAVE_AS.pop()


# --- memory --------------------------------------------------------------------------------


class SavedTensors(torch.autograd.graph.saved_tensors_hooks):
    """Note every tensor autograd saves inside the `with` block; ask later how many bytes
    live on (each storage counted once).

        with SavedTensors() as saved:
            loss = loss_fn(net(X), y)
        saved.live_bytes()      # activations held by the graph of `loss`, freed with it
    """

    def __init__(self) -> None:
        self._refs: list[tuple[weakref.ref, int, int]] = []  # (alias, storage address, bytes)
        super().__init__(self._pack, lambda t: t)

    def __enter__(self) -> SavedTensors:
        super().__enter__()
        return self

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        # The graph keeps a detached alias (same storage): packing `t` itself would make a cycle
        # output -> grad_fn -> output that only Python's slow cycle collector frees.
        held = t.detach()
        with contextlib.suppress(RuntimeError, TypeError):  # tensors without a storage
            storage = held.untyped_storage()
            self._refs.append((weakref.ref(held), storage.data_ptr(), storage.nbytes()))
        return held

    def saved_bytes(self) -> int:
        """Bytes saved for backward, alive or not."""
        return sum({ptr: n for _, ptr, n in self._refs}.values())

    def live_bytes(self) -> int:
        """Bytes of saved tensors still alive now (a graph dies with its last reference)."""
        return sum({ptr: n for ref, ptr, n in self._refs if ref() is not None}.values())


def _tensors(tree: Any) -> Iterator[torch.Tensor]:
    """The tensors in an operator's arguments or outputs (tuples, lists, dicts of them): torch's
    own tree walker is private."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _tensors(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item)


class PeakTensorBytes(TorchDispatchMode):
    """`m.peak`: the most bytes of tensors made inside the `with` block alive at once (a CPU has
    no allocator peak). It weakly tracks every new storage an operator outputs; a view or
    in-place update of a tensor made before the block (`weight.t()`) is not new memory."""

    def __init__(self) -> None:
        super().__init__()
        # by address (`data_ptr`), each with a weak reference that says when it is freed: torch
        # keeps one Python object per live storage, so a plain `weakref` to it is enough
        self._live: dict[int, tuple[weakref.ref, int]] = {}
        self._before: dict[int, weakref.ref] = {}  # storages first seen as inputs: made outside
        self.peak = self.current = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # torch's protocol
        # forget freed storages first: a new storage may reuse a freed one's address
        self._live = {k: v for k, v in self._live.items() if v[0]() is not None}
        self._before = {k: ref for k, ref in self._before.items() if ref() is not None}
        for t in _tensors((args, kwargs)):
            storage = t.untyped_storage()
            if storage.data_ptr() not in self._live:
                self._before.setdefault(storage.data_ptr(), weakref.ref(storage))
        out = func(*args, **(kwargs or {}))
        for t in _tensors(out):
            storage = t.untyped_storage()
            if storage.data_ptr() not in self._before:
                self._live.setdefault(storage.data_ptr(), (weakref.ref(storage), storage.nbytes()))
        self.current = sum(n for _, n in self._live.values())
        self.peak = max(self.peak, self.current)
        return out


def peak_step_bytes(step: Callable[[], object], device: str | torch.device) -> tuple[int, str]:
    """Peak memory `step()` allocates on top of what exists, and how it was measured: the
    allocator's peak where the device keeps one (CUDA, XPU), else `PeakTensorBytes`."""
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


def calibration_step(
    model: nn.Module, input_shape: tuple[int, ...], num_classes: int, device: Any
) -> Callable[[], None]:
    """One plain fp32 SGD step of a *copy* of `model` on a random batch of `input_shape`: what
    `Profile.steps` times to size a notebook's epochs before its data exists (the copy leaves
    `model`'s weights as they were, so every variant still starts from them)."""
    check_int("num_classes", num_classes, 2, where="calibration_step")
    dev = devices.as_device(device)
    net = copy.deepcopy(model).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    X = torch.randn(*input_shape, device=dev)
    y = torch.randint(0, num_classes, (input_shape[0],), device=dev)

    def step() -> None:
        nn.functional.cross_entropy(net(X), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step
