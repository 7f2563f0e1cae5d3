"""Plumbing of notebook 19, the capstone: data, model, recipes, timing a bar, the waterfall.

Its training code (the book's loop, each change of the fast recipe) is written in the notebook's
cells, and `make bench` executes that notebook: one source. A `Recipe` is one bar's settings;
`measure` times the notebook's loop on it and profiles its steady steps; `run_waterfall` puts
each change on the best recipe so far and keeps it only when it wins (`keeps`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torchvision
from torch import nn
from torch.utils.data import Dataset, Subset

from . import data, devices, diagnose, models, timing
from .checks import check_choice, check_int, check_number

D2L_WORKERS = 4  # d2l.get_dataloader_workers()
# timed epochs per bar after the warm-up epoch: a median and a spread (max - min) to keep a change
# by; one timed epoch has no spread, so the 2 % margin alone would decide
MIN_STEADY_EPOCHS = 3
DATA_MODES = ("loader", "memory", "device")
INITS = ("d2l", "default")
PRECISIONS = ("fp32", "bf16", "fp16")  # fp16: autocast with a GradScaler (notebook 12)
SAFEGUARDS = {
    "init": "default",
    "lr_schedule": "linear-decay",
}  # speed-neutral; notebook 19, section 5


@dataclass
class CapstoneData:
    """The same images twice: a torchvision data set (the book's DataLoader) and uint8 tensors."""

    train_ds: Dataset
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
    return CapstoneData(
        train_ds,
        x_tr,
        y_tr,
        x_te,
        y_te,
        bool(train.synthetic),
        f"{data.describe(train)}; using {len(x_tr)} train / {len(x_te)} test images",
    )


def build_net(width: int = 64, seed: int = 0, init: str = "d2l") -> nn.Module:
    """The d2l ResNet-18 from `seed`; `init="d2l"`: the book's N(0, 0.01) Linear and Conv2d
    weights, `"default"`: PyTorch's own (Kaiming-uniform)."""
    check_choice("init", init, INITS, where="build_net")
    torch.manual_seed(seed)
    net = models.resnet18(num_classes=10, in_channels=1, width=width)
    if init == "d2l":
        for m in net.modules():
            if type(m) in (nn.Linear, nn.Conv2d):
                nn.init.normal_(m.weight, std=0.01)
    return net


@dataclass(frozen=True)
class Recipe:
    """One bar of the waterfall: how the data is fed and which changes are on."""

    name: str
    data: str = "loader"  # the book's DataLoader, or uint8 batches in "memory" / on "device"
    batch_size: int = 256
    lr: float = 0.1
    precision: str = "fp32"  # or "bf16" autocast, or "fp16" autocast with a GradScaler
    channels_last: bool = False
    compile: dict[str, Any] | None = None  # torch.compile's keyword arguments; None: eager
    fused: bool = False
    tf32: bool = False  # fp32 matmuls and convolutions on TF32; False: PyTorch's defaults
    cudnn_benchmark: bool | None = None  # None: PyTorch's default (off), as in the book
    init: str = "d2l"  # see build_net
    lr_schedule: str = "constant"  # the book's, or "linear-decay" (to 0 over the run)
    note: str = ""

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("data", self.data, DATA_MODES),
            ("init", self.init, INITS),
            ("lr_schedule", self.lr_schedule, ("constant", "linear-decay")),
            ("precision", self.precision, PRECISIONS),
        ):
            check_choice(name, value, allowed, where="Recipe")
        if self.data == "loader" and self.lr_schedule != "constant":
            raise ValueError(
                "Recipe: data='loader' is the book's loop, which has a constant lr; "
                f"lr_schedule must be 'constant' there, got {self.lr_schedule!r}"
            )
        check_int("batch_size", self.batch_size, 1, where="Recipe")
        check_number("lr", self.lr, where="Recipe")

    def but(self, name: str, **changes: Any) -> Recipe:
        return dataclasses.replace(self, name=name, **changes)

    @property
    def uses_cuda_graphs(self) -> bool:
        return (self.compile or {}).get("mode") in ("reduce-overhead", "max-autotune")


def low_precision(caps: devices.Capabilities) -> str | None:
    """The 16-bit autocast the fast recipe tries on a device: "bf16" where it runs (natively on
    a GPU; a CPU's, emulated or not, is measured and dropped when slower), else "fp16" with a
    GradScaler (a CUDA GPU without native bf16: a T4, a V100), else None (nothing to try)."""
    if caps.ok("bf16"):
        return "bf16"
    return "fp16" if caps.ok("fp16") else None


@dataclass
class StepResult:
    """What one waterfall bar measured."""

    name: str
    seconds_per_epoch: float | None
    samples_per_s: float | None
    busy_fraction: float | None = None
    skipped: str = ""
    note: str = ""
    spread_s: float | None = None  # max - min of the timed epochs (seconds per full epoch)
    extra: dict[str, Any] = field(default_factory=dict)
    # the timed epochs (per full epoch) and their real window, for a claim judged on them (L22)
    timing: timing.Measurement | None = None
    # the profiled steps' time in DataLoader `__next__`; None: no DataLoader (or no profile)
    wait_fraction: float | None = None


# train(net, recipe, num_epochs, max_batches=None, on_step=None)
#     -> {"seconds": [...], "samples": [...]} and, where an epoch starts DataLoader workers,
#        "first_batch": [...], the seconds of each epoch until its first batch arrived
Train = Callable[..., dict[str, list]]


def measure(
    recipe: Recipe,
    train: Train,
    *,
    n_train: int,
    device: torch.device | str,
    width: int = 64,
    epochs: int = MIN_STEADY_EPOCHS,
    max_batches: int | None = None,
    busy_steps: int = 10,
    seed: int = 0,
) -> StepResult:
    """Time `train` on `recipe`: an untimed warm-up epoch (worker start-up, compiling, graph
    recording), then `epochs` timed ones of at most `max_batches` batches, their median scaled
    to `n_train` images. Where an epoch starts DataLoader workers (`out["first_batch"]`), the
    wait for its first batch is paid once per epoch whatever its length: it is added as measured
    and only the batches after it are scaled. Then `busy_steps` steady steps of one more epoch,
    past the loader's prefetch, run under the profiler (`diagnose.StepWindow`): the device's busy
    share and the time in a DataLoader's `__next__`, what `diagnose.bottleneck` labels the bar
    by."""
    dev = devices.as_device(device)
    check_int("epochs", epochs, MIN_STEADY_EPOCHS, where="measure")
    check_int("busy_steps", busy_steps, 0, where="measure")
    if recipe.compile is not None:
        torch.compiler.reset()  # each compiled bar starts clean: no earlier bar's graphs
    net = build_net(width, seed, recipe.init)
    out = train(net, recipe, 1 + epochs, max_batches=max_batches)
    first = out.get("first_batch") or [0.0] * len(out["seconds"])
    per_epoch = [
        _whole_epoch(s, n, f, recipe.batch_size, n_train)
        for s, n, f in list(zip(out["seconds"], out["samples"], first, strict=True))[1:]
    ]
    timed = timing.measurement(per_epoch, recipe.name, window=min(out["seconds"][1:]), device=dev)
    window = _profiled_epoch(net, recipe, train, dev, n_train, busy_steps) if busy_steps else None
    extra: dict[str, Any] = {"epoch_seconds": per_epoch}
    if any(first[1:]):
        extra["first_batch_s"] = statistics.median(first[1:])
    if recipe.uses_cuda_graphs and window is not None:
        # the profiler sees each graph replay as a cudaGraphLaunch; none: the steps ran kernel
        # by kernel (Inductor skipped the graphs; TORCH_LOGS=perf_hints,cudagraphs says why)
        extra["cuda_graph_launches"] = window.count("cudaGraphLaunch")
        extra["cuda_graphs_used"] = extra["cuda_graph_launches"] > 0
    seconds = statistics.median(per_epoch)
    busy = window.busy_fraction if window is not None else None
    return StepResult(
        recipe.name,
        seconds,
        n_train / seconds,
        busy,
        note=recipe.note,
        spread_s=max(per_epoch) - min(per_epoch),
        extra=extra,
        timing=timed,
        wait_fraction=window.wait_fraction if window is not None else None,
    )


def _whole_epoch(seconds: float, samples: int, first_batch: float, batch: int, n: int) -> float:
    """Seconds of an `n`-image epoch from one of `samples` images: the wait for its first batch
    (workers starting, paid once per epoch) as measured, the batches after it scaled; scaling
    it too would count the start `n / samples` times. An epoch of one batch (a slow GPU's sized
    epochs) has no batch after it: its step, after the wait, is scaled, as if the workers kept
    up from then on (a lower bound where they do not)."""
    if not first_batch:
        return n * seconds / samples
    if samples <= batch:
        return first_batch + (seconds - first_batch) * n / samples
    return first_batch + (seconds - first_batch) * max(n - batch, 0) / (samples - batch)


def _profiled_epoch(
    net: nn.Module, recipe: Recipe, train: Train, dev: torch.device, n_train: int, busy_steps: int
) -> diagnose.StepWindow:
    """`busy_steps` steady steps of one more epoch under the profiler, past the warm-up."""
    n_batches = max(n_train // recipe.batch_size, 2)
    # the loader's workers fill their prefetch first; a device also fills its launch queue
    # and allocator cache, which a CPU has not: one step warms it
    warm = 2 * D2L_WORKERS + 2 if recipe.data == "loader" else 1 if dev.type == "cpu" else 3
    steps = min(busy_steps, n_batches - 1)
    window = diagnose.StepWindow(
        device=dev, warmup=max(1, min(warm, n_batches - steps)), steps=steps
    )
    try:
        train(net, recipe, 1, max_batches=window.stop_after, on_step=window)
    finally:
        window.finish()  # the profiler stops also when the run is interrupted
    return window


def waterfall_work(batch: int, big_batch: int, epochs: int = MIN_STEADY_EPOCHS) -> int:
    """The waterfall's work for each batch of a timed epoch, in steps of the reference's size
    (`batch`): the `runs` by which `Profile.steps` multiplies the reference's step time to plan
    notebook 19's budget. Each of its 11 bars runs a warm-up epoch and `epochs` timed ones: the
    reference and the two data bars in steps of `batch`; the three fp32 bars from "larger batch"
    on in steps of `big_batch`, `big_batch / batch` reference steps each; the five from the
    16-bit bar on about half that, their matmuls and convolutions on 16-bit tensor cores (a
    planning figure: where a 16-bit bar is dropped they cost more, which the budget's slack
    takes)."""
    check_int("batch", batch, 1, where="waterfall_work")
    check_int("big_batch", big_batch, batch, where="waterfall_work")
    check_int("epochs", epochs, MIN_STEADY_EPOCHS, where="waterfall_work")
    ratio = big_batch / batch
    return math.ceil((1 + epochs) * (3 + 3 * ratio + 5 * ratio / 2))


def keeps(new: StepResult, best: StepResult, tolerance: float = 0.02) -> bool:
    """Is `new` faster than `best` beyond noise? Its gain must exceed `tolerance` of `best`'s
    time and the spread (max - min over the timed epochs) of each of the two timings."""
    if new.seconds_per_epoch is None or best.seconds_per_epoch is None:
        return False
    # the bar would be torch.compile measured again
    if new.extra.get("cuda_graphs_used") is False:
        new.note = (
            "CUDA graphs did not run: this bar is torch.compile again "
            "(TORCH_LOGS=perf_hints,cudagraphs says why)"
        )
        return False
    gain = best.seconds_per_epoch - new.seconds_per_epoch
    return gain > tolerance * best.seconds_per_epoch and gain > max(
        new.spread_s or 0.0, best.spread_s or 0.0
    )


def run_waterfall(
    ref: Recipe,
    changes: list[tuple[str, dict[str, Any], str]],
    train: Train,
    *,
    skip: dict[str, str] | None = None,
    tolerance: float = 0.02,
    **measure_kw: Any,
) -> list[tuple[Recipe, StepResult, bool]]:
    """Measure `ref`, then each `(name, change, what)` on top of the best recipe kept so far.
    `skip` maps a change's name to the reason it is not measured here: no bar, the reason shown."""
    from tqdm.auto import tqdm

    skip = skip or {}
    out = [(ref, measure(ref, train, **measure_kw), True)]
    best_recipe, best = ref, out[0][1]
    for name, change, what in tqdm(changes, desc="waterfall", unit="step", leave=False):
        recipe = best_recipe.but(name, **change, note=what)
        if name in skip:
            out.append((recipe, StepResult(name, None, None, skipped=skip[name], note=what), False))
            continue
        r = measure(recipe, train, **measure_kw)
        out.append((recipe, r, keeps(r, best, tolerance)))
        if out[-1][2]:
            best_recipe, best = recipe, r
    return out


def fast_recipe(waterfall: list[tuple[Recipe, StepResult, bool]]) -> Recipe:
    """The last kept recipe (every change that won here) with the accuracy `SAFEGUARDS`, or the
    book's loop if nothing beat it."""
    last = [r for r, _, k in waterfall if k][-1]
    return (
        last.but("fast recipe") if last.data == "loader" else last.but("fast recipe", **SAFEGUARDS)
    )


def run_cost(
    samples_per_s: float,
    *,
    price_per_hour: float,
    epochs: int = 10,
    dataset_size: int = 60_000,
    n_devices: int = 1,
) -> dict[str, float]:
    """Hours and money for `epochs` over `dataset_size` samples at a measured `samples_per_s`,
    renting `n_devices` at `price_per_hour` each (claim L22)."""
    check_number("samples_per_s", samples_per_s, where="run_cost")
    check_number("price_per_hour", price_per_hour, where="run_cost", inclusive=True)
    for name, v in (("epochs", epochs), ("dataset_size", dataset_size), ("n_devices", n_devices)):
        check_int(name, v, 1, where="run_cost")
    hours = epochs * dataset_size / samples_per_s / 3600
    return {
        "hours": hours,
        "cost": hours * price_per_hour * n_devices,
        "seconds_per_epoch": dataset_size / samples_per_s,
    }
