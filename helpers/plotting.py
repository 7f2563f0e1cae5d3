"""Plots the notebooks share: bars labelled with their ratio to the first, a waterfall; and
`one_at_a_time`, which keeps an explore section's callback from running beside a cell."""

from __future__ import annotations

import functools
import math
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import matplotlib.pyplot as plt

_Fn = TypeVar("_Fn", bound=Callable[..., Any])

# Held from pre_execute to post_execute by the thread running a cell or a widget message (`comm`
# fires both around each). Re-entrant: interact() calls the callback in the cell that makes it.
_TURN = threading.RLock()
_held = threading.local()  # .on: this thread's pre_execute took _TURN
_LIVE: set[int] = set()  # the wrapped callbacks alive now (by id: a finalizer removes each)


def _take_turn(*_: object) -> None:
    if not getattr(_held, "on", False):  # still on: a handler raised and skipped post_execute
        _TURN.acquire()
        _held.on = True


def _give_turn(*_: object) -> None:  # registered after matplotlib's flush: figures are shown first
    if getattr(_held, "on", False):  # off: the cell that registered the hooks never took it
        _held.on = False
        _TURN.release()


def _hooks_until_collected(wrapper: Callable[..., Any]) -> None:
    """Hold each cell's turn (pre/post_execute) for as long as `wrapper` lives, and no longer:
    the hooks make a cell wait for a running callback and a moved control wait for the running
    cell, which matters only while a control can be moved. The last wrapper collected removes
    them, so no hook outlives the explore controls that needed it."""
    ip = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None  # a kernel
    if ip is None:
        return
    if not _LIVE:
        ip.events.register("pre_execute", _take_turn)
        ip.events.register("post_execute", _give_turn)
    _LIVE.add(id(wrapper))
    weakref.finalize(wrapper, _forget, ip.events, id(wrapper))


def _forget(events: Any, key: int) -> None:
    _LIVE.discard(key)
    if not _LIVE:
        for name, hook in (("pre_execute", _take_turn), ("post_execute", _give_turn)):
            if hook in events.callbacks[name]:
                events.unregister(name, hook)


def one_at_a_time(fn: _Fn) -> _Fn:
    """Run `fn`, an ipywidgets callback, only while no cell and no other widget message runs:
    JupyterLab 4.6 with ipykernel 7 runs a control's callback in a kernel *subshell* thread beside
    the running cell, where both would measure on shared cores, change `torch.set_num_threads`
    under each other and close each other's pyplot figures (ipywidgets has no switch for it)."""
    if not callable(fn):
        raise TypeError(
            f"one_at_a_time: fn must be a function (the explore callback), "
            f"got {type(fn).__name__} {fn!r}"
        )

    @functools.wraps(fn)  # keeps the signature: interact() reads the defaults from it
    def waits_its_turn(*args: Any, **kwargs: Any) -> Any:
        with _TURN:
            return fn(*args, **kwargs)

    _hooks_until_collected(waits_its_turn)
    return waits_its_turn  # type: ignore[return-value]


def _number(what: str, v: object) -> float:
    """`v` as a float, or an error that says which value was not a number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
        raise TypeError(f"{what} must be a number, got {type(v).__name__} {v!r}")
    return float(v)


def bar_compare(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    unit: str,
    higher_is_better: bool = True,
    title: str = "",
    ax: plt.Axes | None = None,
) -> plt.Figure:
    """Bars labelled with their ratio to the first bar ("2.4x": 2.4 times better)."""
    if len(labels) != len(values) or not values:
        raise ValueError("bar_compare: labels and values must be non-empty and the same length")
    values = [_number(f"bar_compare: values[{i}] ({labels[i]!r})", v) for i, v in enumerate(values)]
    if bad := [
        label for label, v in zip(labels, values, strict=True) if not math.isfinite(v) or v < 0
    ]:
        raise ValueError(f"bar_compare: values must be finite and >= 0; not so for {bad}")
    if values[0] <= 0:
        raise ValueError("bar_compare: the baseline (first) value must be positive")
    ratios = [
        v / values[0] if higher_is_better else (values[0] / v if v else math.inf) for v in values
    ]
    fig, ax = (
        plt.subplots(figsize=(max(4.0, 1.1 * len(values) + 2), 3.4))
        if ax is None
        else (ax.figure, ax)
    )
    bars = ax.bar(range(len(values)), values, color=["#999999"] + ["#2a7ab0"] * (len(values) - 1))
    for bar, r in zip(bars, ratios, strict=True):
        ax.annotate(
            f"{r:.2f}x",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
            xytext=(0, 2),
            textcoords="offset points",
        )
    ax.set_xticks(
        range(len(values)),
        labels,
        rotation=20 if len(values) > 3 else 0,
        ha="right" if len(values) > 3 else "center",
    )
    ax.set_ylabel(f"{unit} ({'higher' if higher_is_better else 'lower'} is better)")
    ax.set_title(title or f"ratio to '{labels[0]}' on each bar")
    ax.margins(y=0.15)
    fig.tight_layout()
    return fig


def waterfall(
    steps: Sequence[tuple[str, float]],
    *,
    unit: str = "s / epoch",
    title: str = "",
    kept: Sequence[bool] | None = None,
) -> plt.Figure:
    """Stacked speed-ups over the first bar: each later bar floats from the last *kept* step's
    value to its own; a step not kept (slower, dropped: red) leaves the next on the same base."""
    if not steps:
        raise ValueError("waterfall: give at least one (label, value) step")
    for i, s in enumerate(steps):
        if isinstance(s, str) or len(s) != 2:
            raise ValueError(f"waterfall: steps[{i}] must be a (label, value) pair, got {s!r}")
    values = [_number(f"waterfall: value of step {s[0]!r}", s[1]) for s in steps]
    if any(not math.isfinite(v) or v <= 0 for v in values):
        raise ValueError(f"waterfall: every value must be positive and finite, got {values}")
    kept = [True] * len(values) if kept is None else [bool(k) for k in kept]
    if len(kept) != len(values):
        raise ValueError(
            f"waterfall: kept must have one flag per step ({len(values)}), got {len(kept)}"
        )
    fig, ax = plt.subplots(figsize=(max(5.0, 1.0 * len(steps) + 2), 3.8))
    ref = base = values[0]
    for i, v in enumerate(values):
        bottom, height = (0.0, v) if i == 0 else (min(base, v), abs(base - v))
        color = "#999999" if i == 0 else "#3a9a4a" if kept[i] and v < base else "#c0392b"
        ax.bar(i, max(height, ref * 0.003), bottom=bottom, color=color)
        ax.annotate(
            f"{v:.3g}\n{ref / v:.2f}x",
            (i, bottom + height),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )
        if i:
            ax.plot([i - 1.4, i + 0.4], [base] * 2, color="#555555", lw=0.6, ls=":")
        if kept[i]:
            base = v
    ax.set_xticks(range(len(values)), [str(s[0]) for s in steps], rotation=25, ha="right")
    ax.set_ylabel(unit)
    ax.set_title(title or "cumulative changes (label: value and speed-up over the first bar)")
    ax.margins(y=0.2)
    fig.tight_layout()
    return fig


def sweep(
    series: Mapping[str, Mapping[float, float]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    reference: tuple[str, Mapping[float, float]] | None = None,
    legend: bool = True,
    ax: plt.Axes | None = None,
) -> plt.Figure:
    """One line per variant of a quantity against a size, both axes log, a tick at each size
    measured: the scaling is what a sweep shows. `reference` (label, points) is a dashed black
    line, such as what the arithmetic says."""
    if not series or isinstance(series, str):
        raise ValueError(
            f"sweep: give {{name: {{size: value}}}} for at least one name, got {series!r}"
        )
    lines = dict(series) if reference is None else {**series, reference[0]: reference[1]}
    for name, points in lines.items():
        if not isinstance(points, Mapping):
            raise TypeError(f"sweep: {name!r} must map size -> value, got {points!r}")
        for x, y in points.items():
            _number(f"sweep: {name!r} size", x)
            if not 0 < _number(f"sweep: {name!r} at {x!r}", y) < math.inf:
                raise ValueError(f"sweep: values are drawn on a log axis: {name!r} at {x} is {y}")
    fig, ax = plt.subplots(figsize=(6, 3.6)) if ax is None else (ax.figure, ax)
    for name, points in series.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=name)
    if reference is not None:
        xs = sorted(reference[1])
        ax.plot(xs, [reference[1][x] for x in xs], "k--", label=reference[0])
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
    sizes = sorted({x for points in lines.values() for x in points})
    ax.set_xticks(sizes, [str(x) for x in sizes], minor=False)
    ax.minorticks_off()
    if legend:
        ax.legend(fontsize="small")
    return fig


def split_with_data_parallel(stages: Sequence[str] = ("encoder", "decoder"), replicas: int = 4):
    """The diagram of a model split in two stages, each stage data-parallel over `replicas`
    devices: the batch goes to the first stage's replicas, each hands its activations to the
    second stage's. A drawing, not a measurement: kept here so the lesson's cell stays short."""
    if isinstance(stages, str) or len(stages) != 2:
        raise ValueError(f"split_with_data_parallel: draws two stages, got {stages!r}")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= 4:
        raise ValueError(f"split_with_data_parallel: replicas must be 1 to 4, got {replicas!r}")
    from matplotlib.patches import FancyArrowPatch, Rectangle

    fig, ax = plt.subplots(figsize=(9, 3.8))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 5)
    ax.axis("off")
    ax.add_patch(Rectangle((0.1, 2.1), 1.3, 0.8, color="#cccccc"))
    ax.text(0.75, 2.5, "batch", ha="center", va="center")
    arrow = {"arrowstyle": "->", "mutation_scale": 10}
    for k in range(replicas):
        yk = 4.1 - 1.05 * k
        for stage, (x0, color) in enumerate(((2.6, "#2a7ab0"), (6.3, "#e08a2a"))):
            ax.add_patch(Rectangle((x0, yk), 2.1, 0.75, color=color, alpha=0.85))
            label = f"GPU {k + replicas * stage}: {stages[stage]} replica, 1/{replicas} batch"
            ax.text(
                x0 + 1.05, yk + 0.37, label, ha="center", va="center", color="white", fontsize=8
            )
        ax.add_artist(FancyArrowPatch((1.4, 2.5), (2.6, yk + 0.37), color="#555555", **arrow))
        ax.add_artist(FancyArrowPatch((4.7, yk + 0.37), (6.3, yk + 0.37), color="#c0392b", **arrow))
    hand_off = "activations hand-off (stage 0 -> stage 1)"
    ax.text(5.5, 4.95, hand_off, ha="center", color="#c0392b", fontsize=8)
    for x, group in ((3.65, "A"), (7.35, "B")):
        ax.text(
            x, 0.05, f"data-parallel group {group}: gradients averaged", ha="center", fontsize=8
        )
    n = 2 * replicas
    ax.set_title(f"Model split in 2 stages x data parallel over {replicas}: {n} GPUs")
    return fig


def roofline(
    points: Sequence[Mapping[str, Any]],
    *,
    peaks: Mapping[str, float],
    bandwidth: float,
    overhead: tuple[float, float],
    regime: Callable[[Mapping[str, Any]], str],
    title: str,
) -> plt.Figure:
    """The roofline: each peak's roof (min(peak, bandwidth x intensity)), the overhead ceiling
    of a (FLOPs, seconds) op, and each measured point labelled with `regime(point)`; a learner
    reads from the picture which limit an operation hits."""
    if not peaks or bandwidth <= 0 or any(r <= 0 for r in peaks.values()):
        raise ValueError(
            f"roofline: peaks and bandwidth must be positive, got {dict(peaks)}, {bandwidth}"
        )
    if missing := [p for p in points if not {"name", "intensity", "flop/s"} <= set(p)]:
        raise ValueError(f"roofline: points need name, intensity and flop/s: {missing[0]!r}")
    flops, seconds = overhead
    intensity = [10 ** (-3 + 7 * i / 199) for i in range(200)]  # FLOP per byte
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for name, rate in peaks.items():
        ax.plot(
            intensity,
            [min(rate, bandwidth * x) for x in intensity],
            lw=2.5 if name == "fp32" else 1,
            label=f"{name} roof: {rate / 1e9:,.0f} GFLOP/s",
        )
    ceiling = f"overhead: a {flops:.0f}-FLOP op at {seconds * 1e6:.1f} us per op"
    ax.axhline(flops / seconds, color="grey", ls=":", label=ceiling)
    for p in points:
        ax.scatter(p["intensity"], p["flop/s"], s=70, zorder=3, edgecolor="k")
        ax.annotate(
            f"{p['name']}\n({regime(p)})",
            (p["intensity"], p["flop/s"]),
            textcoords="offset points",
            xytext=(7, -4),
            fontsize="small",
        )
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte)")
    ax.set(ylabel="achieved FLOP/s", title=title)
    ax.legend(fontsize="x-small", loc="upper left")
    return fig


def lines(
    series: Mapping[str, tuple[Sequence[float], Sequence[float], str]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    level: tuple[str, float] | None = None,
) -> plt.Figure:
    """Series against a size on linear axes, each (xs, ys, style: "o" points, ":" a line), and
    an optional dashed grey level (label, y): where measured points meet the arithmetic's line."""
    if not series or isinstance(series, str):
        raise ValueError(f"lines: give {{label: (xs, ys, style)}}, got {series!r}")
    for label, s in series.items():
        if isinstance(s, str) or len(s) != 3 or len(s[0]) != len(s[1]) or not s[0]:
            raise ValueError(f"lines: {label!r} must be (xs, ys, style) with xs and ys alike")
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for label, (xs, ys, style) in series.items():
        ax.plot(xs, ys, style, label=label)
    if level is not None:
        ax.axhline(
            _number(f"lines: level {level[0]!r}", level[1]), color="grey", ls="--", label=level[0]
        )
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
