"""One plain training loop (and an evaluation loop) that the notebooks and the capstone share.

    from helpers import training
    hist = training.train(net, train_iter, num_epochs=2, lr=0.1, device=device,
                          precision="bf16", accum_steps=2, channels_last=True,
                          log_every=50, test_iter=test_iter)
    hist.last.samples_per_s, hist["loss"], hist.steps     # per-epoch stats, logged steps
    training.evaluate(net, test_iter, device=device)       # {'loss', 'accuracy', 'samples'}

Stable API (the capstone builds on it; add keyword arguments, never change these):

`train(net, train_iter, *, num_epochs=1, lr=0.1, device=None, precision="fp32",
accum_steps=1, channels_last=False, compile_model=False, optimizer=None, fused=False,
scheduler=None, scheduler_interval="epoch", loss_fn=None, log_every=0, steps_per_epoch=None,
test_iter=None, progress=True, live_plot=False, tensorboard=None, on_step=None) -> History`

- `train_iter`: any iterable of `(X, y)` batches: a `DataLoader`, or a list / generator of
  tensors already on the device. It is iterated once per epoch (a generator only works for
  one epoch). Batches are moved to `device` with `non_blocking=True` when not already there.
- `device`: `None` means `devices.try_gpu()`; validated by `devices.as_device`.
- `precision`: `"fp32"`; `"fp16"` = autocast to float16 + `torch.amp.GradScaler` (on a CPU:
  a `UserWarning` and **fp32 is used instead**, see `resolve_precision`). With the scaler the
  default SGD is the fused kernel: `GradScaler.step` reads its inf/NaN flag with `.item()` (a
  device sync every step) unless the optimizer takes that flag on the device, which fused SGD
  does (`History.config["fused"]` says which ran); `"bf16"` = autocast
  to bfloat16, no scaler needed (bf16 has fp32's exponent range). bf16 on a CPU without bf16
  hardware runs (emulated) with a warning that it is usually *slower* than fp32.
- `accum_steps=k`: gradients of k micro-batches are accumulated, each loss divided by k, so the
  update equals one k-times batch (for models without batch norm); the optimizer steps every k
  micro-batches, and once more at the end of an epoch for a left-over partial group.
- `channels_last`: model and 4-D inputs in NHWC memory format. `compile_model`: `True` or a
  dict of `torch.compile` keyword arguments (e.g. `{"backend": "eager"}` in tests).
- `optimizer`: an `Optimizer` built on `net`'s parameters, or a factory `params -> Optimizer`;
  `None` = `torch.optim.SGD(lr=lr)` (`fused=True` asks for the fused SGD kernel).
- `on_step`: called as `on_step(k)` after the k-th micro-batch of this call (a profiling
  window such as `diagnose.StepWindow`).
- `scheduler`: a factory `optimizer -> LRScheduler`, stepped every epoch or (with
  `scheduler_interval="step"`) after every optimizer step.
- `loss_fn`: a mean-reduced loss (default `nn.CrossEntropyLoss()`). Accuracy is computed only
  for classification (2-D logits and integer labels); otherwise it is `None`.
- `log_every=k`: every k micro-batches the running loss is read with one `.item()` (one device
  sync) and logged to the progress bar, the live plot and TensorBoard. The other steps never
  sync: loss and correct counts are summed *on the device* and read once per epoch.
- `steps_per_epoch`: stop each epoch after this many micro-batches (smoke runs).
- `live_plot`: `True` or a `plotting.LivePlot` with curves "train loss", "train acc",
  "test acc". `tensorboard`: a log directory or a `SummaryWriter`; skipped with a warning when
  the `tensorboard` package is not installed.

Each epoch gives an `EpochStats`: loss, accuracy, samples, seconds, samples_per_s, data-wait
seconds and fraction (from `data_wait.DataWaitMeter`), peak memory in bytes and how it was
measured (CUDA `max_memory_allocated`, or the process's resident memory sampled at log points
and epoch end on a CPU), learning rate, and test accuracy when `test_iter` is given.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn

from . import devices
from .data_wait import DataWaitMeter

PRECISIONS = ("fp32", "fp16", "bf16")
_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
SCHEDULER_INTERVALS = ("epoch", "step")


# --------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class PrecisionPlan:
    """What a precision request turns into on a device."""

    requested: str
    effective: str
    autocast_dtype: torch.dtype | None
    use_scaler: bool
    note: str = ""


def resolve_precision(precision: str, device: str | torch.device, *, warn: bool = True) -> PrecisionPlan:
    """Validate `precision` for `device` and say what will actually run.

    - unknown name: `ValueError` listing fp32, fp16, bf16;
    - fp16 on a CPU: `UserWarning`, fp32 is used (GradScaler and fast fp16 kernels are GPU
      features; on a CPU use bf16 where it has the hardware);
    - fp16 on a GPU older than compute capability 5.3, bf16 on a GPU without bf16: `ValueError`;
    - bf16 on a CPU without bf16 hardware: runs (emulated) with a `UserWarning` that it is slow.
    """
    if not isinstance(precision, str) or precision.strip().lower() not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    p = precision.strip().lower()
    dev = devices.as_device(device)
    if p == "fp32":
        return PrecisionPlan(p, "fp32", None, False)
    if p == "fp16":
        if dev.type == "cuda":
            major, minor = torch.cuda.get_device_capability(dev)
            if (major, minor) < (5, 3):
                raise ValueError(f"precision='fp16' needs a GPU of compute capability >= 5.3; "
                                 f"{devices.device_name(dev)} has {major}.{minor}: use 'fp32'")
            return PrecisionPlan(p, "fp16", torch.float16, True)
        if dev.type in ("mps", "xpu"):  # autocast and GradScaler exist on both
            return PrecisionPlan(p, "fp16", torch.float16, True)
        note = ("precision='fp16' asked for on the CPU: fp16 autocast with a GradScaler is a GPU "
                "technique, so training falls back to fp32 here (use 'bf16' on CPUs with bf16 hardware)")
        if warn:
            warnings.warn(note, UserWarning, stacklevel=3)
        return PrecisionPlan(p, "fp32", None, False, note)
    # bf16
    if dev.type in ("cuda", "mps", "xpu"):
        if not devices.bf16_supported(dev):
            raise ValueError(f"precision='bf16' needs a GPU with bf16 support (NVIDIA Ampere or newer, "
                             f"an Apple GPU on macOS 14 or newer); "
                             f"{devices.device_name(dev)} has none: use 'fp16' or 'fp32'")
        return PrecisionPlan(p, "bf16", torch.bfloat16, False)
    note = ""
    if not devices.bf16_supported(dev):
        note = ("precision='bf16' on a CPU without bf16 hardware (avx512_bf16/amx): autocast "
                "emulates it and is usually slower than fp32 - measure before using it")
        if warn:
            warnings.warn(note, UserWarning, stacklevel=3)
    return PrecisionPlan(p, "bf16", torch.bfloat16, False, note)


def _check_int(name: str, value: Any, low: int, allow_none: bool = False) -> None:
    if allow_none and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name} must be an int >= {low}{extra}; got {value!r}")


def autocast(device: torch.device, plan: PrecisionPlan):
    """The autocast context for a plan (a no-op context for fp32)."""
    if plan.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=plan.autocast_dtype)


# --------------------------------------------------------------------------- history


@dataclass
class EpochStats:
    epoch: int
    loss: float
    accuracy: float | None
    samples: int
    seconds: float
    samples_per_s: float
    data_wait_s: float
    data_wait_fraction: float
    peak_memory_bytes: int
    memory_kind: str
    lr: float
    optimizer_steps: int
    test_accuracy: float | None = None


@dataclass
class History:
    """What `train` measured: one `EpochStats` per epoch, the logged steps, the settings used."""

    epochs: list[EpochStats] = field(default_factory=list)
    steps: list[tuple[int, float]] = field(default_factory=list)  # (global micro-batch, loss)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def last(self) -> EpochStats:
        if not self.epochs:
            raise IndexError("History.last: no epoch has finished")
        return self.epochs[-1]

    def __getitem__(self, column: str) -> list[Any]:
        """`hist["loss"]`: one value per epoch."""
        if not self.epochs or column not in asdict(self.epochs[0]):
            names = list(EpochStats.__dataclass_fields__)
            raise KeyError(f"History has no column {column!r}; columns are {names}")
        return [getattr(e, column) for e in self.epochs]

    def as_dict(self) -> dict[str, Any]:
        return {"epochs": [asdict(e) for e in self.epochs], "steps": self.steps,
                "config": {k: str(v) for k, v in self.config.items()}}

    def summary(self) -> str:
        e = self.last
        acc = f", train acc {e.accuracy:.3f}" if e.accuracy is not None else ""
        test = f", test acc {e.test_accuracy:.3f}" if e.test_accuracy is not None else ""
        return (f"epoch {e.epoch}: loss {e.loss:.4f}{acc}{test}, {e.samples_per_s:.1f} samples/s, "
                f"data wait {100 * e.data_wait_fraction:.0f} %, "
                f"peak memory {e.peak_memory_bytes / 2**20:.1f} MiB ({e.memory_kind})")


# --------------------------------------------------------------------------- memory


class _PeakMemory:
    """Peak memory over an epoch: exact on CUDA, sampled process RSS on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.exact = devices.has_peak_memory_counter(device)
        self.kind = (f"{device.type} max_memory_allocated" if self.exact
                     else "mps current_allocated_memory, sampled" if device.type == "mps"
                     else "process RSS, sampled")
        self._proc = psutil.Process()
        self.peak = 0

    def reset(self) -> None:
        if self.exact:
            devices.reset_peak_memory(self.device)
        self.peak = 0
        self.sample()

    def sample(self) -> None:
        if self.device.type == "mps":  # no peak counter on MPS: sample Metal's allocation
            self.peak = max(self.peak, devices.memory_allocated(self.device))
        elif not self.exact:
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def read(self) -> int:
        if self.exact:
            return devices.max_memory_allocated(self.device)
        self.sample()
        return int(self.peak)


# --------------------------------------------------------------------------- helpers


def _to_device(t: torch.Tensor, device: torch.device, channels_last: bool) -> torch.Tensor:
    if t.device != device:
        t = t.to(device, non_blocking=True)
    if channels_last and t.dim() == 4:
        t = t.contiguous(memory_format=torch.channels_last)
    return t


def _unpack(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        X, y = batch
    except (TypeError, ValueError) as e:
        raise ValueError("train_iter must yield (X, y) pairs of tensors; got a "
                         f"{type(batch).__name__}") from e
    return X, y


def _is_classification(out: torch.Tensor, y: torch.Tensor) -> bool:
    return out.dim() == 2 and not torch.is_floating_point(y) and y.dim() == 1


def _make_optimizer(net: nn.Module, optimizer: Any, lr: float, fused: bool) -> torch.optim.Optimizer:
    if optimizer is None:
        kwargs = {"fused": True} if fused else {}
        return torch.optim.SGD(net.parameters(), lr=lr, **kwargs)
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer):
        opt = optimizer(net.parameters())
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizer factory must return a torch.optim.Optimizer, got {type(opt).__name__}")
        return opt
    raise TypeError("optimizer must be None, a torch.optim.Optimizer or a factory params -> "
                    f"Optimizer; got {type(optimizer).__name__}")


def _open_tensorboard(tensorboard: Any):
    if tensorboard is None or tensorboard is False:
        return None, False
    if hasattr(tensorboard, "add_scalar"):
        return tensorboard, False
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        warnings.warn("tensorboard is not installed (pip install tensorboard): TensorBoard logging "
                      "skipped", UserWarning, stacklevel=3)
        return None, False
    return SummaryWriter(log_dir=str(Path(tensorboard))), True


def _len_or_none(it: Iterable) -> int | None:
    try:
        return len(it)  # type: ignore[arg-type]
    except TypeError:
        return None


# --------------------------------------------------------------------------- evaluate


def evaluate(net: nn.Module, data_iter: Iterable, *, device: str | torch.device | None = None,
             precision: str = "fp32", channels_last: bool = False,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
             max_batches: int | None = None) -> dict[str, float | None]:
    """Mean loss and accuracy of `net` on `data_iter` (no gradients, one sync at the end).

    Returns `{"loss", "accuracy", "samples"}`; accuracy is `None` for non-classification outputs.
    """
    dev = devices.as_device(device)
    _check_int("max_batches", max_batches, 1, allow_none=True)
    plan = resolve_precision(precision, dev, warn=False)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    was_training = net.training
    net.eval()
    loss_sum = torch.zeros((), device=dev, dtype=torch.float64)
    correct = torch.zeros((), device=dev, dtype=torch.int64)
    n, classification = 0, True
    try:
        with torch.no_grad():
            for i, batch in enumerate(data_iter):
                if max_batches is not None and i >= max_batches:
                    break
                X, y = _unpack(batch)
                X, y = _to_device(X, dev, channels_last), _to_device(y, dev, False)
                with autocast(dev, plan):
                    out = net(X)
                    loss = loss_fn(out, y)
                loss_sum += loss.detach().double() * y.shape[0]
                if _is_classification(out, y):
                    correct += (out.argmax(dim=1) == y).sum()
                else:
                    classification = False
                n += y.shape[0]
    finally:
        net.train(was_training)
    if n == 0:
        raise ValueError("evaluate: data_iter gave no batches")
    return {"loss": loss_sum.item() / n,
            "accuracy": correct.item() / n if classification else None,
            "samples": n}


# --------------------------------------------------------------------------- train


def train(
    net: nn.Module,
    train_iter: Iterable,
    *,
    num_epochs: int = 1,
    lr: float = 0.1,
    device: str | torch.device | None = None,
    precision: str = "fp32",
    accum_steps: int = 1,
    channels_last: bool = False,
    compile_model: bool | dict[str, Any] = False,
    optimizer: torch.optim.Optimizer | Callable[..., torch.optim.Optimizer] | None = None,
    fused: bool = False,
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
    scheduler_interval: str = "epoch",
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    log_every: int = 0,
    steps_per_epoch: int | None = None,
    test_iter: Iterable | None = None,
    progress: bool = True,
    live_plot: Any = False,
    tensorboard: Any = None,
    on_step: Callable[[int], Any] | None = None,
) -> History:
    """Train `net` on `train_iter`; see the module docstring for every switch. Returns a `History`."""
    # ---- validate every switch before doing any work
    dev = devices.as_device(device)
    _check_int("num_epochs", num_epochs, 1)
    _check_int("accum_steps", accum_steps, 1)
    _check_int("log_every", log_every, 0)
    _check_int("steps_per_epoch", steps_per_epoch, 1, allow_none=True)
    if not isinstance(lr, int | float) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a positive finite number; got {lr!r}")
    if scheduler_interval not in SCHEDULER_INTERVALS:
        raise ValueError(f"scheduler_interval must be one of {', '.join(SCHEDULER_INTERVALS)}; "
                         f"got {scheduler_interval!r}")
    if not isinstance(compile_model, bool | dict):
        raise ValueError(f"compile_model must be True/False or a dict of torch.compile options; "
                         f"got {compile_model!r}")
    if isinstance(train_iter, torch.Tensor) or not isinstance(train_iter, Iterable):
        raise ValueError("train_iter must be an iterable of (X, y) batches (a DataLoader, a list, ...)")
    plan = resolve_precision(precision, dev)
    loss_fn = loss_fn or nn.CrossEntropyLoss()

    # ---- set up model, optimizer, scaler, scheduler, loggers
    net.to(dev)
    if channels_last:
        net.to(memory_format=torch.channels_last)
    # fp16's GradScaler syncs every step (found_inf.item()) unless the optimizer is fused
    fused = fused or (plan.use_scaler and optimizer is None and dev.type == "cuda")
    opt = _make_optimizer(net, optimizer, lr, fused)
    sched = scheduler(opt) if scheduler is not None else None
    scaler = torch.amp.GradScaler(dev.type) if plan.use_scaler else None
    model = net
    if compile_model:
        model = torch.compile(net, **(compile_model if isinstance(compile_model, dict) else {}))
    if live_plot is True:
        from .plotting import LivePlot

        live_plot = LivePlot(["train loss", "train acc", "test acc"], xlabel="epoch")
    writer, own_writer = _open_tensorboard(tensorboard)
    memory = _PeakMemory(dev)

    hist = History(config={
        "device": str(dev), "precision": plan.effective, "precision_requested": plan.requested,
        "precision_note": plan.note, "accum_steps": accum_steps, "channels_last": channels_last,
        "compile": bool(compile_model), "optimizer": type(opt).__name__, "lr": lr,
        "fused": bool(opt.defaults.get("fused")),
        "log_every": log_every, "steps_per_epoch": steps_per_epoch,
    })
    n_batches = _len_or_none(train_iter)
    if steps_per_epoch is not None:
        n_batches = min(n_batches, steps_per_epoch) if n_batches is not None else steps_per_epoch
    global_step = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=(n_batches * num_epochs if n_batches else None), desc="train",
                   unit="batch", leave=False)

    try:
        for epoch in range(1, num_epochs + 1):
            net.train()
            memory.reset()
            # the meter syncs only on log steps (never, without logging): time blocked in next()
            # is the data wait that matters, whether or not the device is still busy
            meter = DataWaitMeter(train_iter, device=dev, sync_every=log_every or 2**62)
            loss_sum = torch.zeros((), device=dev, dtype=torch.float64)
            correct = torch.zeros((), device=dev, dtype=torch.int64)
            # running loss since the last log point, kept on the device (no sync)
            log_sum = torch.zeros((), device=dev, dtype=torch.float64)
            log_n = 0
            samples, micro, opt_steps, classification = 0, 0, 0, True
            opt.zero_grad(set_to_none=True)
            devices.synchronize(dev)
            t0 = time.perf_counter()
            for batch in meter:
                X, y = _unpack(batch)
                X, y = _to_device(X, dev, channels_last), _to_device(y, dev, False)
                with autocast(dev, plan):
                    out = model(X)
                    loss = loss_fn(out, y)
                scaled = loss / accum_steps
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
                micro += 1
                global_step += 1
                if micro % accum_steps == 0:
                    opt_steps += _optimizer_step(opt, scaler)
                    if sched is not None and scheduler_interval == "step":
                        sched.step()
                bs = y.shape[0]
                d = loss.detach().double() * bs
                loss_sum += d
                log_sum += d
                log_n += bs
                if _is_classification(out, y):
                    correct += (out.detach().argmax(dim=1) == y).sum()
                else:
                    classification = False
                samples += bs
                if on_step is not None:  # e.g. diagnose.StepWindow: profile steps k..k+n of this loop
                    on_step(global_step)
                if log_every and micro % log_every == 0:
                    value = log_sum.item() / log_n  # the one sync every log_every steps
                    log_sum.zero_()
                    log_n = 0
                    hist.steps.append((global_step, value))
                    memory.sample()
                    if bar is not None:
                        bar.set_postfix(loss=f"{value:.4f}", epoch=epoch)
                    if live_plot:
                        frac = epoch - 1 + (micro / n_batches if n_batches else 0.0)
                        live_plot.add(frac, {"train loss": value})
                    if writer is not None:
                        writer.add_scalar("train/loss_step", value, global_step)
                if bar is not None:
                    bar.update(1)
                if steps_per_epoch is not None and micro >= steps_per_epoch:
                    break
            if micro == 0:
                raise ValueError(f"train: train_iter gave no batches in epoch {epoch} "
                                 "(a generator can only be iterated once: pass a list or a DataLoader)")
            if micro % accum_steps:
                # a left-over partial group: step with what was accumulated (like Lightning)
                opt_steps += _optimizer_step(opt, scaler)
                if sched is not None and scheduler_interval == "step":
                    sched.step()
            devices.synchronize(dev)
            seconds = time.perf_counter() - t0
            lr_now = opt.param_groups[0]["lr"]
            if sched is not None and scheduler_interval == "epoch":
                sched.step()
            wait = meter.summary()
            stats = EpochStats(
                epoch=epoch,
                loss=loss_sum.item() / samples,
                accuracy=correct.item() / samples if classification else None,
                samples=samples,
                seconds=seconds,
                samples_per_s=samples / seconds if seconds > 0 else float("inf"),
                data_wait_s=wait["wait_s"],
                data_wait_fraction=wait["wait_fraction"],
                peak_memory_bytes=memory.read(),
                memory_kind=memory.kind,
                lr=float(lr_now),
                optimizer_steps=opt_steps,
            )
            if test_iter is not None:
                # the eager module shares the compiled one's weights; evaluating it avoids a
                # recompile (and CUDA-graph re-recording) for eval mode and the test shapes
                stats.test_accuracy = evaluate(net, test_iter,
                                               device=dev, precision=plan.effective,
                                               channels_last=channels_last, loss_fn=loss_fn)["accuracy"]
            hist.epochs.append(stats)
            if live_plot:
                live_plot.add(epoch, {"train loss": stats.loss if not log_every else None,
                                      "train acc": stats.accuracy, "test acc": stats.test_accuracy})
            if writer is not None:
                for k in ("loss", "accuracy", "samples_per_s", "data_wait_fraction", "test_accuracy"):
                    v = getattr(stats, k)
                    if v is not None:
                        writer.add_scalar(f"epoch/{k}", v, epoch)
    finally:
        if bar is not None:
            bar.close()
        if writer is not None and own_writer:
            writer.close()
    return hist


def _optimizer_step(opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> int:
    """One update; with a scaler, steps it may skip (inf/NaN gradients) are still counted."""
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)
    return 1
