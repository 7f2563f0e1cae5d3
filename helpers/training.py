"""The one general training loop (and an evaluation loop) that the notebooks and the capstone share.

    from helpers import training
    hist = training.train(net, train_iter, num_epochs=2, lr=0.1, device=device,
                          precision="bf16", accum_steps=2, channels_last=True,
                          log_every=50, test_iter=test_iter)
    hist.last.samples_per_s, hist["loss"], hist.steps     # per-epoch stats, logged steps
    training.evaluate(net, test_iter, device=device)       # {'loss', 'accuracy', 'samples'}

`train(net, train_iter, *, num_epochs=1, lr=0.1, momentum=0.0, lr_schedule="constant",
device=None, precision="fp32", accum_steps=1, channels_last=False, compile_model=False,
fused=False, log_every=0, steps_per_epoch=None, test_iter=None, progress=True, on_step=None)
-> History`

- `train_iter`: any iterable of `(X, y)` batches: a `DataLoader`, or a list / generator of
  tensors already on the device. It is iterated once per epoch (a generator only works for
  one epoch). Batches are moved to `device` with `non_blocking=True` when not already there.
  The loss is cross-entropy; accuracy is computed for 2-D logits and integer labels.
- `steps_per_epoch=n`: an epoch is exactly n micro-batches: fewer when `train_iter` is longer
  (smoke runs), and when it is shorter `train_iter` is iterated again (a fixed number of steps).
- `lr`, `momentum`: SGD (Nesterov momentum when `momentum > 0`; `fused=True` asks for the fused
  kernel). `lr_schedule`: `"constant"`, `"linear-decay"` (to 0 over the run) or `"one-cycle"`
  (`OneCycleLR` peaking at `lr`), stepped after every optimizer step.
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
- `log_every=k`: every k micro-batches the running loss is read with one `.item()` (one device
  sync) and logged to the progress bar. The other steps never sync: loss and correct counts
  are summed *on the device* and read once per epoch.
- `on_step`: called as `on_step(k)` after the k-th micro-batch of this call (a profiling
  window such as `diagnose.StepWindow`).

Each micro-batch runs `forward_backward` (autocast, loss, scaled backward) and each update
`optimizer_step` (the scaler's step and update): the mixed-precision lines notebook 07 shows.

Each epoch gives an `EpochStats`: loss, accuracy, samples, seconds, samples_per_s, data-wait
seconds and fraction (from `data_wait.DataWaitMeter`), peak memory in bytes and how it was
measured (CUDA `max_memory_allocated`, or the process's resident memory sampled at log points
and epoch end on a CPU), the learning rate of its last update, and test accuracy when `test_iter` is given.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil
import torch
from torch import nn

from . import devices
from .checks import check_choice, check_int, check_number
from .data_wait import DataWaitMeter

PRECISIONS = ("fp32", "fp16", "bf16")
LR_SCHEDULES = ("constant", "linear-decay", "one-cycle")


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

    - unknown name (case and spaces do not matter): `ValueError` listing fp32, fp16, bf16;
    - fp16 on a CPU: `UserWarning`, fp32 is used (GradScaler and fast fp16 kernels are GPU
      features; on a CPU use bf16 where it has the hardware);
    - fp16 on a GPU older than compute capability 5.3, bf16 on a GPU without bf16: `ValueError`;
    - bf16 on a CPU without bf16 hardware: runs (emulated) with a `UserWarning` that it is slow.
    """
    p = precision.strip().lower() if isinstance(precision, str) else precision
    check_choice("precision", p, PRECISIONS, where="resolve_precision")
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


def _len_or_none(it: Iterable) -> int | None:
    try:
        return len(it)  # type: ignore[arg-type]
    except TypeError:
        return None


def _epoch(train_iter: Iterable, steps: int | None, epoch: int) -> Iterator[Any]:
    """One epoch of batches: all of `train_iter`, or exactly `steps`, going round it again."""
    n = 0
    while True:
        before = n
        for batch in train_iter:
            yield batch
            n += 1
            if steps is not None and n >= steps:
                return
        if n == before:
            raise ValueError(f"train: train_iter gave no batches in epoch {epoch} "
                             "(a generator can only be iterated once: pass a list or a DataLoader)")
        if steps is None:
            return


def _schedule(opt: torch.optim.Optimizer, name: str, lr: float, total: int | None):
    """The learning-rate schedule, stepped once per optimizer step; `total` steps in the run."""
    if name == "constant":
        return None
    if total is None:
        raise ValueError(f"train: lr_schedule={name!r} needs the run's length: give steps_per_epoch "
                         "or a train_iter with a len()")
    if name == "linear-decay":
        return torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.0, total_iters=total)
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total)


# --------------------------------------------------------------------------- the mixed-precision step


def forward_backward(model: nn.Module, X: torch.Tensor, y: torch.Tensor, plan: PrecisionPlan,
                     scaler: torch.amp.GradScaler | None,
                     accum_steps: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and loss under autocast, then backward of the loss (scaled, for fp16)."""
    with autocast(X.device, plan):  # matmuls and convolutions in fp16/bf16, reductions in fp32
        out = model(X)
        loss = nn.functional.cross_entropy(out, y)
    scaled = loss / accum_steps  # gradient accumulation: k micro-batches make one mean
    if scaler is not None:
        scaled = scaler.scale(scaled)  # fp16: times 2^16 or so, so small gradients do not underflow
    scaled.backward()  # the weights stay fp32, so do their gradients
    return out, loss


def optimizer_step(opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
    """The update; with a scaler it unscales the gradients first and skips a step with inf/NaN."""
    if scaler is not None:
        scaler.step(opt)  # unscale_, check for inf/NaN, then opt.step() only if all are finite
        scaler.update()  # halve the factor after a skipped step, grow it after a run of good ones
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)


# --------------------------------------------------------------------------- evaluate


def evaluate(net: nn.Module, data_iter: Iterable, *, device: str | torch.device | None = None,
             precision: str = "fp32", channels_last: bool = False) -> dict[str, float | None]:
    """Mean cross-entropy and accuracy of `net` on `data_iter` (no gradients, one sync at the end).

    Returns `{"loss", "accuracy", "samples"}`; accuracy is `None` for non-classification outputs.
    """
    dev = devices.as_device(device)
    plan = resolve_precision(precision, dev, warn=False)
    was_training = net.training
    net.eval()
    loss_sum = torch.zeros((), device=dev, dtype=torch.float64)
    correct = torch.zeros((), device=dev, dtype=torch.int64)
    n, classification = 0, True
    try:
        with torch.no_grad():
            for batch in data_iter:
                X, y = _unpack(batch)
                X, y = _to_device(X, dev, channels_last), _to_device(y, dev, False)
                with autocast(dev, plan):
                    out = net(X)
                    loss = nn.functional.cross_entropy(out, y)
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
    momentum: float = 0.0,
    lr_schedule: str = "constant",
    device: str | torch.device | None = None,
    precision: str = "fp32",
    accum_steps: int = 1,
    channels_last: bool = False,
    compile_model: bool | dict[str, Any] = False,
    fused: bool = False,
    log_every: int = 0,
    steps_per_epoch: int | None = None,
    test_iter: Iterable | None = None,
    progress: bool = True,
    on_step: Callable[[int], Any] | None = None,
) -> History:
    """Train `net` on `train_iter`; see the module docstring for every switch. Returns a `History`."""
    # ---- validate every switch before doing any work
    dev = devices.as_device(device)
    check_int("num_epochs", num_epochs, 1, where="train")
    check_int("accum_steps", accum_steps, 1, where="train")
    check_int("log_every", log_every, 0, where="train")
    check_int("steps_per_epoch", steps_per_epoch, 1, where="train", allow_none=True)
    check_number("lr", lr, where="train")
    check_number("momentum", momentum, where="train", inclusive=True)
    check_choice("lr_schedule", lr_schedule, LR_SCHEDULES, where="train")
    if not isinstance(compile_model, bool | dict):
        raise ValueError(f"train: compile_model must be True/False or a dict of torch.compile "
                         f"options, got {compile_model!r}")
    if isinstance(train_iter, torch.Tensor) or not isinstance(train_iter, Iterable):
        raise ValueError("train: train_iter must be an iterable of (X, y) batches (a DataLoader, "
                         "a list, ...)")
    plan = resolve_precision(precision, dev)
    n_batches = steps_per_epoch or _len_or_none(train_iter)

    # ---- set up model, optimizer, scaler, schedule
    net.to(dev)
    if channels_last:
        net.to(memory_format=torch.channels_last)
    # fp16's GradScaler syncs every step (found_inf.item()) unless the optimizer is fused
    fused = fused or (plan.use_scaler and dev.type == "cuda")
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, nesterov=momentum > 0,
                          **({"fused": True} if fused else {}))
    total = num_epochs * math.ceil(n_batches / accum_steps) if n_batches else None
    sched = _schedule(opt, lr_schedule, lr, total)
    scaler = torch.amp.GradScaler(dev.type) if plan.use_scaler else None
    model = net
    compiling = compile_model is not False  # {} is "compile with the default options", not off
    if compiling:
        model = torch.compile(net, **(compile_model if isinstance(compile_model, dict) else {}))
    memory = _PeakMemory(dev)

    hist = History(config={
        "device": str(dev), "precision": plan.effective, "precision_requested": plan.requested,
        "precision_note": plan.note, "accum_steps": accum_steps, "channels_last": channels_last,
        "compile": compiling, "lr": lr, "momentum": momentum, "lr_schedule": lr_schedule,
        "fused": bool(opt.defaults.get("fused")),
        "log_every": log_every, "steps_per_epoch": steps_per_epoch,
    })
    global_step = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=(n_batches * num_epochs if n_batches else None), desc="train",
                   unit="batch", leave=False)

    last_lr = [lr]  # the rate of the latest update (a schedule has moved on after it)

    def step() -> int:
        """One update; with a scaler, steps it may skip (inf/NaN gradients) are still counted."""
        last_lr[0] = opt.param_groups[0]["lr"]
        optimizer_step(opt, scaler)
        if sched is not None:
            sched.step()
        return 1

    try:
        for epoch in range(1, num_epochs + 1):
            net.train()
            memory.reset()
            # the meter syncs only on log steps (never, without logging): time blocked in next()
            # is the data wait that matters, whether or not the device is still busy
            meter = DataWaitMeter(_epoch(train_iter, steps_per_epoch, epoch), device=dev,
                                  sync_every=log_every or 2**62)
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
                out, loss = forward_backward(model, X, y, plan, scaler, accum_steps)
                micro += 1
                global_step += 1
                if micro % accum_steps == 0:
                    opt_steps += step()
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
                if bar is not None:
                    bar.update(1)
            if micro % accum_steps:
                # a left-over partial group: step with what was accumulated (like Lightning)
                opt_steps += step()
            devices.synchronize(dev)
            seconds = time.perf_counter() - t0
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
                lr=float(last_lr[0]),
                optimizer_steps=opt_steps,
            )
            if test_iter is not None:
                # the eager module shares the compiled one's weights; evaluating it avoids a
                # recompile (and CUDA-graph re-recording) for eval mode and the test shapes
                stats.test_accuracy = evaluate(net, test_iter, device=dev, precision=plan.effective,
                                               channels_last=channels_last)["accuracy"]
            hist.epochs.append(stats)
    finally:
        if bar is not None:
            bar.close()
    return hist
