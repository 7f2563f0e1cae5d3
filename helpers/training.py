"""A plain training loop, and evaluation, for the notebooks that are not about the loop itself.

    hist = training.train(net, batches, num_epochs=2, lr=0.1, device=device)
    hist.last.samples_per_s, hist["loss"]                  # per-epoch stats
    training.evaluate(net, test_batches, device=device)     # {'loss', 'accuracy', 'samples'}

The notebooks that teach the loop write it in their own cells (04: accumulation, 07: mixed
precision, 12: the book's loop and the fast recipe). This one is SGD on cross-entropy in fp32:
- `train_iter`: any iterable of `(X, y)` batches (a `DataLoader`, a list of tensors on the
  device); batches are moved to `device` when they are not there yet.
- `steps_per_epoch=n`: an epoch is exactly n batches, going round `train_iter` again if needed.
- `momentum > 0`: Nesterov momentum. `lr_schedule`: "constant", "linear-decay" (to 0 over the
  run) or "one-cycle" (`OneCycleLR` peaking at `lr`), stepped after every update.
- Loss and correct predictions are summed on the device and read once per epoch (notebook 05
  shows why: every read is a device sync).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from . import devices
from .checks import check_choice, check_int, check_number

LR_SCHEDULES = ("constant", "linear-decay", "one-cycle")


@dataclass
class EpochStats:
    epoch: int
    loss: float
    accuracy: float | None
    samples: int
    seconds: float
    samples_per_s: float
    optimizer_steps: int
    lr: float


@dataclass
class History:
    """What `train` measured: one `EpochStats` per epoch."""

    epochs: list[EpochStats] = field(default_factory=list)

    @property
    def last(self) -> EpochStats:
        if not self.epochs:
            raise IndexError("History.last: no epoch has finished")
        return self.epochs[-1]

    def __getitem__(self, column: str) -> list[Any]:
        """`hist["loss"]`: one value per epoch."""
        if not self.epochs or column not in asdict(self.epochs[0]):
            raise KeyError(f"History has no column {column!r}; columns are {list(EpochStats.__dataclass_fields__)}")
        return [getattr(e, column) for e in self.epochs]


def _pairs(batches: Iterable, steps: int | None, device: torch.device,
           where: str = "train: train_iter") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of `(X, y)` on `device`: all of `batches`, or exactly `steps`, going round again."""
    n = 0
    while True:
        before = n
        for batch in batches:
            try:
                X, y = batch
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where} must yield (X, y) pairs; got a {type(batch).__name__}") from e
            yield X.to(device, non_blocking=True), y.to(device, non_blocking=True)
            n += 1
            if steps is not None and n >= steps:
                return
        if n == before:
            raise ValueError(f"{where} gave no batches (a generator can only be iterated once: "
                             "pass a list or a DataLoader)")
        if steps is None:
            return


def _schedule(opt: torch.optim.Optimizer, name: str, lr: float, total: int | None) -> Any:
    """The learning-rate schedule, stepped once per update; `total` updates in the run."""
    if name == "constant":
        return None
    if total is None:
        raise ValueError(f"train: lr_schedule={name!r} needs the run's length: give steps_per_epoch "
                         "or a train_iter with a len()")
    if name == "linear-decay":
        return torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.0, total_iters=total)
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total)


def evaluate(net: nn.Module, data_iter: Iterable, *, device: str | torch.device | None = None) -> dict[str, Any]:
    """Mean cross-entropy and accuracy of `net` on `data_iter` (no gradients, one sync at the end)."""
    dev = devices.as_device(device)
    was_training = net.training
    net.eval()
    loss_sum = torch.zeros((), device=dev, dtype=torch.float64)
    correct = torch.zeros((), device=dev, dtype=torch.int64)
    n = 0
    try:
        with torch.no_grad():
            for X, y in _pairs(data_iter, None, dev, "evaluate: data_iter"):
                out = net(X)
                loss_sum += nn.functional.cross_entropy(out, y).double() * len(y)
                correct += (out.argmax(dim=1) == y).sum()
                n += len(y)
    finally:
        net.train(was_training)
    return {"loss": loss_sum.item() / n, "accuracy": correct.item() / n, "samples": n}


def train(net: nn.Module, train_iter: Iterable, *, num_epochs: int = 1, lr: float = 0.1,
          momentum: float = 0.0, lr_schedule: str = "constant", device: str | torch.device | None = None,
          steps_per_epoch: int | None = None, progress: bool = True) -> History:
    """Train `net` with SGD on cross-entropy; see the module docstring. Returns a `History`."""
    dev = devices.as_device(device)
    check_int("num_epochs", num_epochs, 1, where="train")
    check_int("steps_per_epoch", steps_per_epoch, 1, where="train", allow_none=True)
    check_number("lr", lr, where="train")
    check_number("momentum", momentum, where="train", inclusive=True)
    check_choice("lr_schedule", lr_schedule, LR_SCHEDULES, where="train")
    if isinstance(train_iter, torch.Tensor) or not isinstance(train_iter, Iterable):
        raise ValueError("train: train_iter must be an iterable of (X, y) batches (a DataLoader, a list, ...)")
    per_epoch = steps_per_epoch or (len(train_iter) if hasattr(train_iter, "__len__") else None)
    net.to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, nesterov=momentum > 0)
    sched = _schedule(opt, lr_schedule, lr, num_epochs * per_epoch if per_epoch else None)
    hist = History()
    from tqdm.auto import tqdm

    bar = tqdm(total=per_epoch and per_epoch * num_epochs, desc="train", unit="batch", leave=False,
               disable=not progress)
    try:
        for epoch in range(1, num_epochs + 1):
            hist.epochs.append(_epoch(net, opt, sched, _pairs(train_iter, steps_per_epoch, dev), epoch, bar))
    finally:
        bar.close()
    return hist


def _epoch(net: nn.Module, opt: torch.optim.Optimizer, sched: Any, pairs: Iterator, epoch: int,
           bar: Any) -> EpochStats:
    """One epoch; the loss and correct counts stay on the device until its end."""
    net.train()
    dev = next(net.parameters()).device
    loss_sum = torch.zeros((), device=dev, dtype=torch.float64)
    correct = torch.zeros((), device=dev, dtype=torch.int64)
    samples = steps = 0
    devices.synchronize(dev)
    t0 = time.perf_counter()
    for X, y in pairs:
        out = net(X)
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        lr = opt.param_groups[0]["lr"]
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()
        steps, samples = steps + 1, samples + len(y)
        loss_sum += loss.detach().double() * len(y)
        correct += (out.detach().argmax(dim=1) == y).sum()
        bar.update(1)
    devices.synchronize(dev)
    seconds = time.perf_counter() - t0
    return EpochStats(epoch, loss_sum.item() / samples, correct.item() / samples, samples, seconds,
                      samples / seconds if seconds > 0 else float("inf"), steps, float(lr))
