"""Plots the notebooks share: a live training plot, a ratio-labelled bar chart, a waterfall; and
`one_at_a_time`, which keeps an explore section's callback from running beside a cell."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import matplotlib

matplotlib.rcParams.setdefault("figure.dpi", 90)
import matplotlib.pyplot as plt  # noqa: E402

from .checks import check_int  # noqa: E402

_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython

        ip = get_ipython()
        return ip is not None and hasattr(ip, "kernel")
    except ImportError:
        return False


# Held by the thread that runs a cell or handles a widget message, from IPython's pre_execute to
# its post_execute (the `comm` package fires both around each widget message, in whichever thread
# handles it). Re-entrant: interact() calls the callback inside the cell that creates the controls.
_TURN = threading.RLock()
_held = threading.local()  # .on: this thread's pre_execute took _TURN


def _take_turn(*_: object) -> None:
    if not getattr(_held, "on", False):  # already held: a handler that raised never gave it back
        _TURN.acquire()
        _held.on = True


def _give_turn(*_: object) -> None:
    # registered after matplotlib's inline flush: figures are shown and closed before the next turn
    if getattr(_held, "on", False):
        _held.on = False
        _TURN.release()


def one_at_a_time(fn: _Fn) -> _Fn:
    """Run `fn`, an ipywidgets callback, only while no cell and no other widget message runs.

    Why: JupyterLab 4.6 with ipykernel 7 sends widget messages over a kernel *subshell*, so from
    the second change of a control on, its callback runs in a thread of its own, at the same time
    as the cell the kernel is running. Two measurements would share the cores (both numbers
    wrong), `torch.set_num_threads` would change under the cell, and the two threads would draw,
    show and close each other's pyplot figures. ipywidgets has no switch for this, so from the
    first call on, every cell and every widget message takes one turn at a time.
    """
    if not callable(fn):
        raise TypeError(f"one_at_a_time: fn must be a function (the explore callback), "
                        f"got {type(fn).__name__} {fn!r}")
    if _in_notebook():
        from IPython import get_ipython

        events = get_ipython().events
        if _take_turn not in events.callbacks["pre_execute"]:
            events.register("pre_execute", _take_turn)
            events.register("post_execute", _give_turn)

    @functools.wraps(fn)   # keeps the signature: interact() reads the defaults from it
    def waits_its_turn(*args: Any, **kwargs: Any) -> Any:
        with _TURN:   # also where no pre_execute took it: the cell that registered the hooks
            return fn(*args, **kwargs)

    return waits_its_turn  # type: ignore[return-value]


class LivePlot:
    """Curves that grow as training runs (d2l's `Animator`), redrawn in place in Jupyter.

    >>> lp = LivePlot(["train loss", "train acc"], xlabel="epoch")
    >>> lp.add(1, {"train loss": 0.9, "train acc": 0.6})

    Headless (no kernel) it just keeps the figure up to date; `lp.fig` can be saved.
    """

    def __init__(self, legend: Sequence[str], *, xlabel: str = "epoch", ylabel: str = "",
                 title: str = "", figsize: tuple[float, float] = (5, 3.2)) -> None:
        if isinstance(legend, str) or not all(isinstance(k, str) for k in legend):
            raise TypeError(f"LivePlot: legend must be a list of curve names such as ['train loss'], "
                            f"got {legend!r}")
        if not legend:
            raise ValueError("LivePlot: legend must name at least one curve")
        self.legend = list(legend)
        self.xs: dict[str, list[float]] = {k: [] for k in self.legend}
        self.ys: dict[str, list[float]] = {k: [] for k in self.legend}
        self.fig, self.ax = plt.subplots(figsize=figsize)
        self.ax.set_xlabel(xlabel)
        self.ax.set_ylabel(ylabel)
        if title:
            self.ax.set_title(title)
        self._handle = None
        if _in_notebook():
            from IPython.display import display

            plt.close(self.fig)  # we display it ourselves, once, then update that output
            self._handle = display(self.fig, display_id=True)

    def add(self, x: float, values: dict[str, float] | Sequence[float]) -> None:
        if not isinstance(values, dict):
            values = dict(zip(self.legend, values, strict=False))
        unknown = set(values) - set(self.legend)
        if unknown:
            raise ValueError(f"LivePlot.add: unknown curve(s) {sorted(unknown)}; known: {self.legend}")
        x = _number("LivePlot.add: x", x)
        for k, v in values.items():
            if v is not None:
                self.xs[k].append(x)
                self.ys[k].append(_number(f"LivePlot.add: value of {k!r}", v))
        self.redraw()

    def redraw(self) -> None:
        ax = self.ax
        for line in list(ax.lines):
            line.remove()
        for k in self.legend:
            if self.xs[k]:
                ax.plot(self.xs[k], self.ys[k], marker="o", ms=3, label=k)
        ax.relim()
        ax.autoscale_view()
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        if self._handle is not None:
            self._handle.update(self.fig)


def _number(what: str, v: object) -> float:
    """`v` as a float, or an error that says which value was not a number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
        raise TypeError(f"{what} must be a number, got {type(v).__name__} {v!r}")
    return float(v)


def _ratios(values: Sequence[float], baseline: int, higher_is_better: bool) -> list[float]:
    b = values[baseline]
    if higher_is_better:
        return [v / b for v in values]
    return [b / v if v else float("inf") for v in values]


def bar_compare(labels: Sequence[str], values: Sequence[float], *, unit: str,
                baseline: int = 0, higher_is_better: bool = True, title: str = "",
                ax: plt.Axes | None = None) -> plt.Figure:
    """Bars labelled with their ratio to the baseline bar ("2.4x" means 2.4 times better)."""
    if len(labels) != len(values) or not values:
        raise ValueError("bar_compare: labels and values must be non-empty and the same length")
    values = [_number(f"bar_compare: values[{i}] ({labels[i]!r})", v) for i, v in enumerate(values)]
    bad = [labels[i] for i, v in enumerate(values) if not math.isfinite(v) or v < 0]
    if bad:
        raise ValueError(f"bar_compare: values must be finite and >= 0; not so for {bad}")
    check_int("baseline", baseline, 0, where="bar_compare")
    if baseline >= len(values):
        raise ValueError(f"bar_compare: baseline must index a bar (0..{len(values) - 1}), got {baseline}")
    if values[baseline] <= 0:
        raise ValueError("bar_compare: the baseline value must be positive")
    ratios = _ratios(values, baseline, higher_is_better)
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(values) + 2), 3.4))
    else:
        fig = ax.figure
    colors = ["#999999" if i == baseline else "#2a7ab0" for i in range(len(values))]
    bars = ax.bar(range(len(values)), values, color=colors)
    for bar, r in zip(bars, ratios, strict=True):
        ax.annotate(f"{r:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=9, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(values)), labels, rotation=20 if len(values) > 3 else 0, ha="right" if len(values) > 3 else "center")
    better = "higher is better" if higher_is_better else "lower is better"
    ax.set_ylabel(f"{unit} ({better})")
    ax.set_title(title or f"ratio to '{labels[baseline]}' on each bar")
    ax.margins(y=0.15)
    fig.tight_layout()
    return fig


def waterfall(steps: Sequence[tuple[str, float]], *, unit: str = "s / epoch", title: str = "",
              kept: Sequence[bool] | None = None, ax: plt.Axes | None = None) -> plt.Figure:
    """Stacked speed-ups: the first bar is the reference; each later bar floats from the value of
    the last *kept* step to its own, labelled with its speed-up over the reference. A step marked
    not kept (`kept[i] == False`: it was slower and dropped) is drawn in red, and the next step
    starts again from the last kept value, because that is what it was stacked on."""
    if not steps:
        raise ValueError("waterfall: give at least one (label, value) step")
    for i, s in enumerate(steps):
        if isinstance(s, str) or len(s) != 2:
            raise ValueError(f"waterfall: steps[{i}] must be a (label, value) pair, got {s!r}")
    labels = [str(s[0]) for s in steps]
    values = [_number(f"waterfall: value of step {s[0]!r}", s[1]) for s in steps]
    if any(not math.isfinite(v) or v <= 0 for v in values):
        raise ValueError(f"waterfall: every value must be positive and finite, got {values}")
    kept = [True] * len(values) if kept is None else [bool(k) for k in kept]
    if len(kept) != len(values):
        raise ValueError(f"waterfall: kept must have one flag per step ({len(values)}), got {len(kept)}")
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(5.0, 1.0 * len(steps) + 2), 3.8))
    else:
        fig = ax.figure
    ref = values[0]
    base = ref
    for i, v in enumerate(values):
        if i == 0:
            bottom, height, color = 0.0, v, "#999999"
        else:
            bottom, height = min(base, v), abs(base - v)
            color = "#3a9a4a" if kept[i] and v < base else "#c0392b"
        ax.bar(i, max(height, ref * 0.003), bottom=bottom, color=color)
        ax.annotate(f"{v:.3g}\n{ref / v:.2f}x", (i, max(bottom + height, v)), ha="center",
                    va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
        if i:
            ax.plot([i - 1.4, i + 0.4], [base] * 2, color="#555555", lw=0.6, ls=":")
        if i == 0 or kept[i]:
            base = v
    ax.set_xticks(range(len(values)), labels, rotation=25, ha="right")
    ax.set_ylabel(unit)
    ax.set_title(title or "cumulative changes (label: value and speed-up over the first bar)")
    ax.margins(y=0.2)
    fig.tight_layout()
    return fig
