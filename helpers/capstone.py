"""The capstone: d2l's ResNet-18 on Fashion-MNIST, from the book's loop to a fast recipe.

Shared by notebook 12 and `python -m benchmarks.capstone` so both measure the same code.

- `train_reference`: the training loop as Dive into Deep Learning writes it (torchvision
  `ToTensor`, a `DataLoader` with d2l's 4 workers, fp32, plain SGD, weights initialised
  N(0, 0.01)) on one device, like every fast recipe (`n_devices=2`: the book's `nn.DataParallel`).
- `waterfall_changes`: the cumulative changes, each a `Recipe`: uint8 data in memory -> data
  resident on the device -> larger batch with scaled lr -> cudnn.benchmark -> TF32 -> bf16
  autocast -> channels_last -> torch.compile -> CUDA graphs -> fused optimizer.
- `train_recipe`: a recipe's training: each change one switch of `helpers.training.train`, the
  global backend switches set around it (`backend_flags`).
- `fast_recipe`: the changes that won on this device, plus the accuracy safeguards
  (`SAFEGUARDS`: PyTorch's default init, lr decayed to zero), which cost nothing per step and
  keep the accuracy when a larger batch gives fewer updates per epoch.
- `measure`: seconds per epoch (the median of at least 3 steady epochs after an untimed
  warm-up epoch that pays for worker start-up, compilation and CUDA-graph recording; fewer are
  refused where a compile is involved), their spread, samples/s, and how busy the device was
  (`torch.profiler` over 10 steady steps of the same training loop, `diagnose.StepWindow`).
- `keeps`: a waterfall step is kept only when its gain beats both the tolerance and the
  measured spread of the two timings it compares.
- `accuracy_curve`: test accuracy after every epoch, from the same seed, for any recipe.
- `run_cost`: the time-vs-money arithmetic of claim L22.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from . import data, devices, diagnose, models, training
from .checks import check_choice, check_int, check_number
from .device_augment import TensorBatches, to_unit_float
from .timing import Timer

D2L_WORKERS = 4  # d2l.get_dataloader_workers()
MIN_STEADY_EPOCHS = 3  # timed epochs a compiled recipe needs (the warm-up epoch compiles)
BUSY_STEPS = 10        # steady steps profiled for busy % (a GPU step is milliseconds)
DATA_MODES = ("loader", "memory", "device")
INITS = ("d2l", "default")
LR_SCHEDULES = ("constant", "linear-decay")
# Speed-neutral changes the fast recipe always makes (see `build_net` for why the init matters).
SAFEGUARDS: dict[str, str] = {"init": "default", "lr_schedule": "linear-decay"}


# --------------------------------------------------------------------------- data


@dataclass
class CapstoneData:
    """The same images twice: torchvision data sets (for the reference) and uint8 tensors."""

    train_ds: Dataset
    test_ds: Dataset
    x_train: torch.Tensor  # uint8 (N, 1, 28, 28)
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    synthetic: bool
    description: str


def load_data(n_train: int | None = None, n_test: int | None = None) -> CapstoneData:
    """Fashion-MNIST (real, or the labelled synthetic stand-in), optionally the first n images."""
    for name, v in (("n_train", n_train), ("n_test", n_test)):
        check_int(name, v, 1, where="load_data", allow_none=True)
    to_tensor = torchvision.transforms.ToTensor()
    train = data.fashion_mnist(train=True, transform=to_tensor)
    test = data.fashion_mnist(train=False, transform=to_tensor)
    x_tr, y_tr = data.as_tensors(train, n_train)
    x_te, y_te = data.as_tensors(test, n_test)
    train_ds = Subset(train, range(len(x_tr))) if n_train else train
    test_ds = Subset(test, range(len(x_te))) if n_test else test
    return CapstoneData(train_ds, test_ds, x_tr, y_tr, x_te, y_te, bool(train.synthetic),
                        f"{data.describe(train)}; using {len(x_tr)} train / {len(x_te)} test images")


# --------------------------------------------------------------------------- the reference


def d2l_init_weights(module: nn.Module) -> None:
    """d2l's initialisation for this chapter: N(0, 0.01) weights for Linear and Conv2d."""
    if type(module) in [nn.Linear, nn.Conv2d]:
        nn.init.normal_(module.weight, std=0.01)


def build_net(width: int = 64, seed: int = 0, init: str = "d2l") -> nn.Module:
    """The d2l ResNet-18, reproducible from `seed`.

    `init="d2l"`: the book's N(0, 0.01) weights. `init="default"`: PyTorch's own (Kaiming-uniform)
    initialisation. Behind batch norm, tiny conv weights make every SGD step act as a huge one
    (the normalisation divides the weight's scale out), so the book's start needs many small
    updates to settle; a large batch gives fewer updates per epoch, and from N(0, 0.01) it can
    fall far behind after the same epochs (notebook 12, section 5 measures it).
    """
    check_choice("init", init, INITS, where="build_net")
    torch.manual_seed(seed)
    net = models.resnet18(num_classes=10, in_channels=1, width=width)
    if init == "d2l":
        net.apply(d2l_init_weights)
    return net


def evaluate_accuracy(net: nn.Module, data_iter: Any, device: torch.device) -> float:
    """d2l's `evaluate_accuracy_gpu`: fraction of correct predictions."""
    net.eval()
    correct, n = 0, 0
    with torch.no_grad():
        for X, y in data_iter:
            X, y = X.to(device), y.to(device)
            correct += (net(X).argmax(dim=1) == y).sum().item()
            n += y.numel()
    return correct / n


def train_reference(net: nn.Module, train_ds: Dataset, test_ds: Dataset | None, *,
                    batch_size: int = 256, lr: float = 0.1, num_epochs: int = 1,
                    num_workers: int = D2L_WORKERS, max_batches: int | None = None,
                    seed: int = 0, n_devices: int = 1, on_step: Any = None) -> dict[str, Any]:
    """The book's loop (d2l 'Concise Implementation for Multiple GPUs'), timed per epoch the
    way the book times it, plus a device sync. `max_batches` cuts epochs short (smoke runs).
    With `test_ds`, test accuracy is evaluated after every epoch, outside the timer, as the book
    does for its plot; `test_accuracy` is the last one. One device by default, so that it is
    compared with the fast recipes on equal terms; `n_devices` > 1 wraps the book's
    `nn.DataParallel` over that many GPUs (claim L23's two-GPU run). `on_step(k)` is called
    after the k-th step (a `diagnose.StepWindow` profiling steady steps of this loop)."""
    check_int("n_devices", n_devices, 1, where="train_reference")
    devs = devices.try_all_gpus()[:n_devices]
    if len(devs) < n_devices or (n_devices > 1 and devs[0].type != "cuda"):
        raise ValueError(f"train_reference: n_devices={n_devices} but this machine has "
                         f"{devices.num_gpus()} GPU(s)")
    torch.manual_seed(seed)
    train_iter = DataLoader(train_ds, batch_size, shuffle=True, num_workers=num_workers)
    net = nn.DataParallel(net, device_ids=devs) if len(devs) > 1 else net
    net.to(devs[0])
    trainer = torch.optim.SGD(net.parameters(), lr)
    loss = nn.CrossEntropyLoss()
    timer = Timer(devs[0])
    samples: list[int] = []
    accuracies: list[float] = []
    test_iter = DataLoader(test_ds, batch_size, num_workers=0) if test_ds is not None else None
    for _ in range(num_epochs):
        net.train()
        timer.start()
        n = 0
        for i, (X, y) in enumerate(train_iter):
            trainer.zero_grad()
            X, y = X.to(devs[0]), y.to(devs[0])
            l = loss(net(X), y)  # noqa: E741 (the book's name)
            l.backward()
            trainer.step()
            n += len(y)
            if on_step is not None:
                on_step(i + 1)
            if max_batches is not None and i + 1 >= max_batches:
                break
        timer.stop()
        samples.append(n)
        if test_iter is not None:
            accuracies.append(evaluate_accuracy(net, test_iter, devs[0]))
    return {"seconds": timer.times, "samples": samples, "test_accuracies": accuracies,
            "test_accuracy": accuracies[-1] if accuracies else None, "net": net}


# --------------------------------------------------------------------------- the recipes


@dataclass(frozen=True)
class Recipe:
    """One bar of the waterfall: how the data is fed and which training switches are on."""

    name: str
    data: str = "loader"            # "loader" (the reference) | "memory" | "device"
    batch_size: int = 256
    lr: float = 0.1
    precision: str = "fp32"
    channels_last: bool = False
    compile: dict[str, Any] | None = None
    fused: bool = False
    tf32: bool = False              # fp32 matmuls on TF32 tensor cores (convs use TF32 already)
    init: str = "d2l"               # "d2l": N(0, 0.01) | "default": PyTorch's init
    lr_schedule: str = "constant"   # "constant" (the book) | "linear-decay" (to 0 over the run)
    # cuDNN autotuning (torch.backends.cudnn.benchmark: cuDNN times the convolution algorithms
    # once per shape) while this recipe runs; None leaves PyTorch's default (off), as the book
    # does. Set and restored by `backend_flags`, as is `tf32`.
    cudnn_benchmark: bool | None = None
    note: str = ""

    def __post_init__(self) -> None:
        for name, value, allowed in (("data", self.data, DATA_MODES), ("init", self.init, INITS),
                                     ("lr_schedule", self.lr_schedule, LR_SCHEDULES)):
            check_choice(name, value, allowed, where="Recipe")
        if self.data == "loader" and self.lr_schedule != "constant":
            raise ValueError("Recipe: data='loader' is the book's loop, which has a constant lr; "
                             f"lr_schedule must be 'constant' there, got {self.lr_schedule!r}")
        check_int("batch_size", self.batch_size, 1, where="Recipe")
        check_number("lr", self.lr, where="Recipe")

    def but(self, name: str, **changes: Any) -> Recipe:
        return dataclasses.replace(self, name=name, **changes)

    @property
    def uses_cuda_graphs(self) -> bool:
        c = self.compile or {}
        return c.get("mode") in ("reduce-overhead", "max-autotune") or bool(
            (c.get("options") or {}).get("triton.cudagraphs"))


@contextlib.contextmanager
def backend_flags(recipe: Recipe) -> Iterator[None]:
    """Apply the recipe's global backend switches for the duration, then restore them, so one
    bar's setting never leaks into the next bar (or into a later test)."""
    saved = (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision())
    precision = "high" if recipe.tf32 else "highest"
    try:
        if recipe.cudnn_benchmark is not None:
            torch.backends.cudnn.benchmark = recipe.cudnn_benchmark
        if saved[1] != precision:  # touch the matmul backends only when the setting changes
            torch.set_float32_matmul_precision(precision)
        yield
    finally:
        torch.backends.cudnn.benchmark = saved[0]
        if torch.get_float32_matmul_precision() != saved[1]:
            torch.set_float32_matmul_precision(saved[1])


def waterfall_changes(*, batch_size: int = 256, lr: float = 0.1, big_batch: int = 1024,
                      device: torch.device | str = "cpu",
                      ) -> tuple[Recipe, list[tuple[str, dict[str, Any], str]]]:
    """The reference recipe and the changes stacked on it, as (name, change, what it does)."""
    dev = torch.device(device)
    scaled_lr = lr * big_batch / batch_size
    ref = Recipe("reference (d2l)", batch_size=batch_size, lr=lr, note="the book's loop")
    # default mode: Inductor's fused kernels without minutes of autotuning per waterfall bar;
    # "reduce-overhead" adds CUDA graphs: the compiled model's forward and backward are each
    # replayed with one launch. The loss, accuracy count, optimizer and scheduler stay eager
    # (kernel by kernel) unless they are compiled too; `measure` records whether graphs ran.
    graphs = {"mode": "reduce-overhead"} if dev.type == "cuda" else {}
    return ref, [
        ("uint8 in memory", dict(data="memory"),
         "whole data set as one uint8 tensor; no workers, no per-sample ToTensor"),
        ("on the device", dict(data="device"),
         "data resident on the device, shuffled and sliced there"),
        ("larger batch", dict(batch_size=big_batch, lr=scaled_lr),
         f"batch {big_batch}, lr scaled linearly to {scaled_lr:g}"),
        ("cudnn.benchmark", dict(cudnn_benchmark=True),
         "cuDNN tries each convolution's algorithms once and keeps the fastest"),
        ("TF32 matmuls", dict(tf32=True),
         "fp32 matrix multiplies on TF32 tensor cores (convolutions use TF32 by default)"),
        ("bf16 autocast", dict(precision="bf16"),
         "matmuls and convolutions in bfloat16"),
        ("channels_last", dict(channels_last=True),
         "NHWC memory format for convolutions"),
        ("torch.compile", dict(compile={}),
         "fused kernels (Inductor, default mode)"),
        ("+ CUDA graphs", dict(compile=graphs),
         "forward and backward replayed as CUDA graphs (optimizer stays eager)"),
        ("fused SGD", dict(fused=True),
         "one fused optimizer kernel for all parameters"),
    ]


def run_waterfall(d: CapstoneData, *, device: torch.device | str, width: int = 64,
                  batch_size: int = 256, lr: float = 0.1, big_batch: int = 1024,
                  epochs: int = MIN_STEADY_EPOCHS, max_batches: int | None = None,
                  busy_batches: int = BUSY_STEPS,
                  skip: dict[str, str] | None = None, tolerance: float = 0.02,
                  num_workers: int = D2L_WORKERS, progress: bool = True,
                  ) -> list[tuple[Recipe, StepResult, bool]]:
    """Measure the reference, then each change on top of the best recipe kept so far.

    A change is kept when it is faster than the best kept recipe by more than `tolerance` and
    by more than the spread of either timing (`keeps`); a change that is not is shown and
    dropped. A CUDA-graphs bar whose graphs did not run (Inductor skipped them) is dropped
    with that reason: it would be torch.compile measured again. `skip` maps a step name to the
    reason it is not measured (no GPU for CUDA graphs, no time for compilation, ...): it gets no
    bar and the reason is printed, never a made-up number.
    """
    dev = devices.as_device(device)
    skip = dict(skip or {})
    if dev.type != "cuda":
        skip.setdefault("+ CUDA graphs", "needs a CUDA GPU")
        skip.setdefault("cudnn.benchmark", "cuDNN is NVIDIA's GPU library: no effect on this device")
        skip.setdefault("TF32 matmuls", "TF32 is an NVIDIA tensor-core format: no effect on this device")
    ref, changes = waterfall_changes(batch_size=batch_size, lr=lr, big_batch=big_batch, device=dev)
    kw = dict(device=dev, width=width, epochs=epochs, max_batches=max_batches,
              busy_batches=busy_batches, num_workers=num_workers)
    from tqdm.auto import tqdm

    bar = tqdm(total=1 + len(changes), desc="waterfall", unit="step", disable=not progress, leave=False)
    out = [(ref, measure(ref, d, **kw), True)]
    bar.update(1)
    best_recipe, best = ref, out[0][1]
    for name, change, what in changes:
        recipe = best_recipe.but(name, **change, note=what)
        if name in skip:
            out.append((recipe, StepResult(name, None, None, skipped=skip[name], note=what), False))
        else:
            r = measure(recipe, d, **kw)
            keep = keeps(r, best, tolerance) and not graphs_missing(recipe, r)
            out.append((recipe, r, keep))
            if keep:
                best_recipe, best = recipe, r
        bar.update(1)
    bar.close()
    return out


def graphs_missing(recipe: Recipe, r: StepResult) -> bool:
    """True when `recipe` asked for CUDA graphs but they did not run (Inductor skipped them, or
    the profiled steps launched none): the bar would be torch.compile measured again, so it says
    so in its note and is not kept."""
    if not recipe.uses_cuda_graphs or r.extra.get("cuda_graphs_used") is not False:
        return False
    r.note = (f"CUDA graphs did not run ({r.extra.get('cudagraph_skips')} skip(s), "
              f"{r.extra.get('cuda_graph_launches')} graph launches profiled): this bar is "
              "torch.compile again; TORCH_LOGS=perf_hints,cudagraphs says why")
    return True


def keeps(new: StepResult, best: StepResult, tolerance: float = 0.02) -> bool:
    """Is `new` faster than `best` beyond noise? Its gain must exceed `tolerance` of `best`'s
    time and the spread (max - min over the timed epochs) of each of the two timings."""
    if new.seconds_per_epoch is None or best.seconds_per_epoch is None:
        return False
    gain = best.seconds_per_epoch - new.seconds_per_epoch
    noise = max(new.spread_s or 0.0, best.spread_s or 0.0)
    return gain > tolerance * best.seconds_per_epoch and gain > noise


def fast_recipe(waterfall: list[tuple[Recipe, StepResult, bool]]) -> Recipe:
    """The last kept recipe of a waterfall (every change that won on this device) with the
    accuracy `SAFEGUARDS`. If nothing beat the book's loop, the fast recipe is that loop."""
    kept = [r for r, _, k in waterfall if k]
    if kept[-1].data == "loader":
        return kept[-1].but("fast recipe")
    return kept[-1].but("fast recipe", **SAFEGUARDS)


@dataclass
class StepResult:
    """What one waterfall bar measured."""

    name: str
    seconds_per_epoch: float | None
    samples_per_s: float | None
    busy_fraction: float | None = None
    test_accuracy: float | None = None
    skipped: str = ""
    note: str = ""
    spread_s: float | None = None  # max - min of the timed epochs (seconds per full epoch)
    extra: dict[str, Any] = field(default_factory=dict)


def _epoch_batches(recipe: Recipe, d: CapstoneData, device: torch.device, seed: int) -> TensorBatches:
    """The uint8 images in host memory (pinned staging on CUDA) or resident on the device, each
    batch converted there to `ToTensor()`'s values."""
    # Compiled steps (CUDA graphs above all) want one batch shape: the last partial batch is
    # dropped; seconds per epoch are scaled from samples/s, so the figure stays per full epoch.
    return TensorBatches(d.x_train, d.y_train, recipe.batch_size, augment=to_unit_float,
                         mode=recipe.data, device=device, seed=seed,
                         drop_last=bool(recipe.compile is not None))


def train_recipe(net: nn.Module, recipe: Recipe, batches: Any, *, device: torch.device,
                 num_epochs: int = 1, max_batches: int | None = None, test_iter: Any = None,
                 on_step: Any = None) -> training.History:
    """Train `net` as `recipe` says, in the suite's one training loop (`training.train`).
    `batches` carry the data change ("uint8 in memory", "on the device"); every other change
    of the waterfall is one switch of the loop, named in the comment beside it."""
    # an epoch is at most max_batches (train's steps_per_epoch would go round a shorter epoch)
    steps = min(len(batches), max_batches) if max_batches else None
    with backend_flags(recipe):                     # "cudnn.benchmark", "TF32 matmuls"
        return training.train(
            net, batches, num_epochs=num_epochs, device=device,
            lr=recipe.lr,                           # "larger batch": lr scaled with it
            lr_schedule=recipe.lr_schedule,         # accuracy safeguard: "linear-decay" to 0
            precision=recipe.precision,             # "bf16 autocast"
            channels_last=recipe.channels_last,     # "channels_last"
            # "torch.compile" ({}: the default mode), "+ CUDA graphs" ({"mode": "reduce-overhead"})
            compile_model=False if recipe.compile is None else recipe.compile,
            fused=recipe.fused,                     # "fused SGD"
            steps_per_epoch=steps, test_iter=test_iter, progress=False, on_step=on_step)


def _busy_window(n_batches: int, busy_batches: int, warmup: int) -> tuple[int, int]:
    """(warm-up steps, profiled steps) that fit in one epoch of `n_batches`."""
    steps = min(busy_batches, max(n_batches - 1, 1))
    return max(1, min(warmup, n_batches - steps)), steps


def _cuda_graph_skips() -> int:
    from torch._dynamo.utils import counters  # Inductor counts every CUDA-graph skip here

    return int(counters["inductor"]["cudagraph_skips"])


def measure(recipe: Recipe, d: CapstoneData, *, device: torch.device | str, width: int = 64,
            epochs: int = MIN_STEADY_EPOCHS, max_batches: int | None = None,
            busy_batches: int = BUSY_STEPS, num_workers: int = D2L_WORKERS, seed: int = 0,
            warmup_epochs: int = 1) -> StepResult:
    """Time `recipe`: `warmup_epochs` untimed epochs (worker start-up, compilation, CUDA-graph
    recording), then `epochs` timed ones (at most `max_batches` batches each); seconds per epoch
    are the median of the timed epochs, scaled to the whole training set from the timed samples,
    and `spread_s` is their max - min. A compiled recipe needs at least `MIN_STEADY_EPOCHS`.
    Then `busy_batches` steady steps of one more epoch (after a few unprofiled ones from the
    same iterator) run under the profiler for the busy fraction."""
    dev = devices.as_device(device)
    for name, v, low in (("epochs", epochs, 1), ("warmup_epochs", warmup_epochs, 0),
                         ("busy_batches", busy_batches, 0)):
        check_int(name, v, low, where="measure")
    if recipe.compile is not None and (epochs < MIN_STEADY_EPOCHS or warmup_epochs < 1):
        raise ValueError(f"measure: {recipe.name!r} compiles; time at least {MIN_STEADY_EPOCHS} steady "
                         f"epochs after at least one warm-up epoch (got epochs={epochs}, "
                         f"warmup_epochs={warmup_epochs}): the first epochs compile and record graphs")
    if recipe.compile is not None:
        # each compiled bar starts from a clean slate: no earlier bar's graphs, recorded CUDA
        # graphs or recompile count carried over (and their memory freed)
        torch._dynamo.reset()
    net = build_net(width, seed, recipe.init)
    n_epoch = len(d.x_train)
    total = warmup_epochs + epochs
    skips0 = _cuda_graph_skips() if recipe.compile is not None else 0
    with backend_flags(recipe):
        if recipe.data == "loader":
            out = train_reference(net, d.train_ds, None, batch_size=recipe.batch_size, lr=recipe.lr,
                                  num_epochs=total, num_workers=num_workers, max_batches=max_batches,
                                  seed=seed)
            timed = list(zip(out["seconds"], out["samples"], strict=True))[warmup_epochs:]
            ref_net = out["net"].module if isinstance(out["net"], nn.DataParallel) else out["net"]
            n_batches = math.ceil(len(d.train_ds) / recipe.batch_size)
            # past the workers' prefetch queue (2 batches each), so the window sees steady supply
            warm, steps = _busy_window(n_batches, busy_batches, 2 * num_workers + 2)

            def profiled(window: diagnose.StepWindow) -> None:
                train_reference(ref_net, d.train_ds, None, batch_size=recipe.batch_size, lr=recipe.lr,
                                num_epochs=1, num_workers=num_workers, max_batches=window.stop_after,
                                seed=seed, on_step=window)
        else:
            # built once: the profiled steps below then time training, not copying the data set
            batches = _epoch_batches(recipe, d, dev, seed)
            hist = train_recipe(net, recipe, batches, device=dev, num_epochs=total,
                                max_batches=max_batches)
            timed = [(e.seconds, e.samples) for e in hist.epochs[warmup_epochs:]]
            warm, steps = _busy_window(len(batches), busy_batches, 3)

            def profiled(window: diagnose.StepWindow) -> None:
                train_recipe(net, recipe, batches, device=dev, num_epochs=1,
                             max_batches=window.stop_after, on_step=window)
        window = None
        if busy_batches:
            window = diagnose.StepWindow(device=dev, warmup=warm, steps=steps)
            profiled(window)
            window.finish()
    per_epoch = [n_epoch * secs / n for secs, n in timed]
    secs_per_epoch = statistics.median(per_epoch)
    extra: dict[str, Any] = {"timed_samples": sum(n for _, n in timed),
                             "timed_seconds": sum(t for t, _ in timed),
                             "epoch_seconds": per_epoch, "warmup_epochs": warmup_epochs,
                             "cudnn_benchmark": torch.backends.cudnn.benchmark
                             if recipe.cudnn_benchmark is None else recipe.cudnn_benchmark}
    if window is not None:
        extra["busy_steps"] = window.steps_done
    if recipe.uses_cuda_graphs:
        extra["cudagraph_skips"] = _cuda_graph_skips() - skips0
        launches = window.count("cudaGraphLaunch") if window is not None else None
        extra["cuda_graph_launches"] = launches
        # used: Inductor skipped nothing and, where profiled, the steady steps replayed graphs
        extra["cuda_graphs_used"] = extra["cudagraph_skips"] == 0 and launches != 0
    return StepResult(recipe.name, secs_per_epoch, n_epoch / secs_per_epoch,
                      window.busy_fraction if window is not None else None, note=recipe.note,
                      spread_s=max(per_epoch) - min(per_epoch), extra=extra)


def accuracy_curve(recipe: Recipe, d: CapstoneData, *, device: torch.device | str,
                   width: int = 64, epochs: int = 1, seed: int = 0,
                   num_workers: int = D2L_WORKERS) -> list[float]:
    """Train `recipe` for `epochs` full epochs from `seed`'s initial weights (the recipe's init);
    return the test accuracy after every epoch."""
    check_int("epochs", epochs, 1, where="accuracy_curve")
    dev = devices.as_device(device)
    net = build_net(width, seed, recipe.init)
    with backend_flags(recipe):
        return _accuracy_curve(recipe, net, d, dev, epochs, seed, num_workers)


def _accuracy_curve(recipe: Recipe, net: nn.Module, d: CapstoneData, dev: torch.device,
                    epochs: int, seed: int, num_workers: int) -> list[float]:
    if recipe.data == "loader":
        return train_reference(net, d.train_ds, d.test_ds, batch_size=recipe.batch_size,
                               lr=recipe.lr, num_epochs=epochs, num_workers=num_workers,
                               seed=seed)["test_accuracies"]
    test_iter = [(xb.float() / 255, yb) for xb, yb in
                 zip(d.x_test.split(1024), d.y_test.split(1024), strict=True)]
    hist = train_recipe(net, recipe, _epoch_batches(recipe, d, dev, seed), device=dev,
                        num_epochs=epochs, test_iter=test_iter)
    return [float(a) for a in hist["test_accuracy"]]


def train_for_accuracy(recipe: Recipe, d: CapstoneData, *, device: torch.device | str,
                       width: int = 64, epochs: int = 1, seed: int = 0,
                       num_workers: int = D2L_WORKERS) -> float:
    """Test accuracy after `epochs` full epochs (the last point of `accuracy_curve`)."""
    return accuracy_curve(recipe, d, device=device, width=width, epochs=epochs, seed=seed,
                          num_workers=num_workers)[-1]


# --------------------------------------------------------------------------- time vs money


def run_cost(samples_per_s: float, *, price_per_hour: float, epochs: int = 10,
             dataset_size: int = 60_000, n_devices: int = 1) -> dict[str, float]:
    """Wall time (hours) and money for `epochs` over `dataset_size` samples at a measured
    `samples_per_s`, renting `n_devices` at `price_per_hour` each (claim L22)."""
    check_number("samples_per_s", samples_per_s, where="run_cost")
    check_number("price_per_hour", price_per_hour, where="run_cost", inclusive=True)
    for name, v in (("epochs", epochs), ("dataset_size", dataset_size), ("n_devices", n_devices)):
        check_int(name, v, 1, where="run_cost")
    hours = epochs * dataset_size / samples_per_s / 3600
    return {"hours": hours, "cost": hours * price_per_hour * n_devices,
            "seconds_per_epoch": dataset_size / samples_per_s}
