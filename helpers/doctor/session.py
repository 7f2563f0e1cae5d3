"""The engine both forms share: steps seen through the optimizer, measured in windows.

A step is the interval between two steps of the first optimizer the process takes
(`register_optimizer_step_post_hook`, public and global: it sees a script the doctor did not
write; a second optimizer, a GAN's, is ignored; LBFGS's closure runs inside one step). The
steps go through windows, one after the other, so that no window's instrument is in another's
timings: warm-up, timed (nothing but a clock), profiled (`torch.profiler`: data wait, device
busy, sync stalls), counted (dispatch modes: syncs, ops, FLOPs, the hot ops' dtypes), then the
what-if trials a form asks for (each with its own warm-up), then memory (the memory held at each
step's end, for its trend: last, so that it sees the loop as it is, and in no timing).
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from .. import devices, processes
from ..diagnose import profiler_activities
from .counting import OpCounter
from .memory import MEMORY, MEMORY_STEPS, Sampler
from .rules import Measured, Trial

# Warm-up steps per DataLoader worker: a worker's start (a process, its first batches) is no
# step's cost. The loop's own warm-up and a workers what-if's both use it.
WARMUP_PER_WORKER = 2
# torch.compile's warning when a module runs with global module hooks installed
COMPILE_HOOKS_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


class Stop(BaseException):  # not an error: the doctor has what it needs
    """Raised from the optimizer hook when the CLI has seen enough steps (BaseException, so a
    script's `except Exception` does not swallow it)."""


@dataclass
class Window:
    name: str
    steps: int
    enter: Callable[[], None] | None = None
    exit: Callable[[], None] | None = None
    batch: int | None = None  # samples per step in a trial (the loop's own when None)
    seconds: float = 0.0  # and at least this long: short steps need many for a steady median
    times: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    t0: float = 0.0
    t1: float = 0.0
    entered: bool = False  # its instrument started (possibly before any of its steps)
    warmup: bool = False  # a what-if's untimed steps with the change made: no trial result


MEASURING = ("warmup", "timed", "profiled", "counted")  # the windows every session runs first


def spread(times: list[float]) -> float:
    """The timed window's step-to-step spread: the interquartile range (a stray slow step, a
    neighbour's burst, moves it less than a standard deviation)."""
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4)
    return q3 - q1


class Session:
    """Counts steps of the first optimizer and moves them through the windows."""

    def __init__(
        self,
        *,
        warmup: int = 2,
        timed: int = 8,
        profiled: int = 2,
        counted: int = 2,
        trial_steps: int | None = 4,  # None: as many as the timed window (equal work)
        seconds: float = 0.3,
        trials: Callable[[Session], list[Window]] | None = None,
        on_done: Callable[[], None] | None = None,
        workers: int | None = 0,
        memory: int = MEMORY_STEPS,  # the memory window's steps; 0: memory over time not watched
    ) -> None:
        # the DataLoader workers the warm-up covers; None: the child processes alive at the
        # first step (the command line, where the loader is not in hand)
        self.workers = workers
        self.seconds = seconds
        self.windows = [
            Window("warmup", warmup),
            Window("timed", timed, seconds=seconds),
            Window("profiled", profiled, self._start_profiler, self._stop_profiler),
            Window("counted", counted, self._start_counting, self._stop_counting),
        ]
        self.trial_steps, self.plan_trials, self.on_done = trial_steps, trials, on_done
        self.index, self.opt, self.device = 0, None, None
        self.steps, self.wait, self.done, self.handle = 0, 0.0, False, None
        self.prof = self.counter = self.flops = None
        self.instrument = contextlib.ExitStack()  # the open window's instrument, if any
        self.workers_seen, self.mem_peak, self.rates = 0, 0.0, None
        self.other_steps: dict[str, int] = {}  # steps of optimizers other than the first
        self.memory: Sampler | None = None  # the memory window's instrument, once it opens
        self.memory_steps = memory

    def named_window(self, name: str) -> Window:
        """One of the MEASURING windows, by name (complete or not: see `named`)."""
        return next(w for w in self.windows[: len(MEASURING)] if w.name == name)

    @property
    def trial_windows(self) -> list[Window]:
        """The what-ifs' windows, planned after the counted window (the memory window is none)."""
        return [w for w in self.windows[len(MEASURING) :] if w.name != MEMORY]

    @property
    def window(self) -> Window | None:
        return None if self.done or self.index >= len(self.windows) else self.windows[self.index]

    def start(self) -> Session:
        self.handle = register_optimizer_step_post_hook(self._hook)
        self.last = time.perf_counter()
        return self

    def close(self) -> None:
        """Remove the hook and end any open instrument (also after an error or a Stop)."""
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        w = self.window
        # stopped mid-window, or right after its instrument started: end that instrument
        if w is not None and w.exit is not None and (w.t0 or w.entered) and not w.t1:
            w.exit()
        self.done = True

    def note_wait(self, seconds: float) -> None:
        """Time the loop spent waiting for a batch (the in-notebook form times `next()`)."""
        self.wait += seconds

    def _hook(self, opt: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        if self.opt is None:
            self.opt = opt
            self.device = next((p.device for g in opt.param_groups for p in g["params"]), None)
        if opt is not self.opt:  # a GAN's second optimizer: its work is inside the step
            name = type(opt).__name__
            self.other_steps[name] = self.other_steps.get(name, 0) + 1
            return
        if self.done:
            return
        now = time.perf_counter()
        if self.steps == 0 and self.workers != 0:
            self._cover_workers()
        w = self.windows[self.index]
        if not w.t0:  # the window opened with this step
            w.t0 = self.last
        w.times.append(now - self.last)
        w.waits.append(self.wait)
        if w.name == MEMORY and self.memory is not None:
            self.memory.sample()
        self.steps, self.wait = self.steps + 1, 0.0
        if len(w.times) >= w.steps and now - w.t0 >= w.seconds:
            self._next_window(w)
        self.last = time.perf_counter()  # the instruments' own start-up is in no step

    @property
    def trial_length(self) -> int:
        """Steps a what-if's timed window takes."""
        return self.trial_steps or self.named_window("timed").steps

    def _cover_workers(self) -> None:
        """Longer warm-up for the workers' start; in a run bounded in steps (no `seconds`) the
        timed window gives those steps up, so that the run keeps its length."""
        k = len(psutil.Process().children()) if self.workers is None else self.workers
        warmup, timed = self.named_window("warmup"), self.named_window("timed")
        warmup.steps += WARMUP_PER_WORKER * k
        if not self.seconds:
            timed.steps -= min(WARMUP_PER_WORKER * k, max(0, timed.steps - 3))

    def _next_window(self, w: Window) -> None:
        devices.synchronize(self.device or torch.device("cpu"))
        w.t1 = time.perf_counter()
        if w.exit is not None:
            w.exit()
        self._sample_memory()
        if w.name == "counted":
            if self.plan_trials is not None:
                self.windows += self.plan_trials(self)
            if self.memory_steps:
                self.windows.append(
                    Window(MEMORY, self.memory_steps, self._start_memory, self._stop_memory)
                )
        self.index += 1
        if self.index == len(self.windows):
            self.close()
            if self.on_done is not None:
                self.on_done()
            return
        nxt = self.windows[self.index]
        if nxt.enter is not None:
            nxt.enter()
            nxt.entered = True
        devices.synchronize(self.device or torch.device("cpu"))

    def trial(
        self,
        name: str,
        enter: Callable[[], None],
        exit: Callable[[], None],
        batch: int | None,
        warmup: int = 2,
    ) -> list[Window]:
        """A what-if: `warmup` steps with the change made (not timed), then the timed steps."""
        return [
            Window(f"{name}:warmup", warmup, enter, warmup=True),
            Window(name, self.trial_length, None, exit, batch=batch, seconds=self.seconds),
        ]

    # --- the instruments -------------------------------------------------------------------
    # Each instrument is entered on `self.instrument`, an ExitStack: its stop (the window's
    # exit, or `close` after an error or a Stop) ends what it entered, in reverse order.
    def _start_profiler(self) -> None:
        acts = [ProfilerActivity.CPU] if self.device is None else profiler_activities(self.device)
        self.prof = self.instrument.enter_context(profile(activities=acts))

    def _stop_profiler(self) -> None:
        self.instrument.close()
        self.workers_seen = len(psutil.Process().children())

    def _start_counting(self) -> None:
        # FlopCounterMode tracks modules with global hooks, for which a torch.compile'd module
        # warns: the doctor's own hooks, for these steps only, so the warning is the doctor's
        self.instrument.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", COMPILE_HOOKS_WARNING, UserWarning)
        self.flops = self.instrument.enter_context(FlopCounterMode(display=False))
        self.counter = self.instrument.enter_context(OpCounter(self.device))

    def _stop_counting(self) -> None:
        self.instrument.close()

    def _start_memory(self) -> None:
        self.memory = Sampler(self.device)
        self.memory.enter()
        self.instrument.callback(self.memory.exit)

    def _stop_memory(self) -> None:
        self.instrument.close()

    def _sample_memory(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            self.mem_peak = float(torch.cuda.max_memory_allocated(self.device))
        else:
            self.mem_peak = max(self.mem_peak, float(psutil.Process().memory_info().rss))

    def step_counting(self) -> str:
        """How a step was counted, in words: the report says it, so the user can check that a
        step is what they call one."""
        if self.opt is None:
            return "no optimizer step seen"
        name = type(self.opt).__name__
        text = f"a step is the interval between two calls of {name}.step()"
        if isinstance(self.opt, torch.optim.LBFGS):
            text += " (with its closure's forward and backward passes inside)"
        if self.other_steps and self.steps:
            others = ", ".join(
                f"{k}.step() {v / self.steps:.2g} per step" for k, v in self.other_steps.items()
            )
            text += f"; other optimizers, counted inside the step: {others}"
        return text

    # --- what the windows measured ---------------------------------------------------------
    def named(self, name: str) -> Window | None:
        return next((w for w in self.windows if w.name == name and w.t1), None)

    def measured(
        self, batch_size: int | None = None, loader: dict | None = None, workers: int | None = None
    ) -> Measured:
        """The numbers for the rules; raises when not even the timed window completed."""
        timed = self.named("timed")
        if timed is None:
            raise RuntimeError(
                f"the doctor saw {self.steps} optimizer steps; it needs "
                f"{sum(self.named_window(n).steps for n in MEASURING[:2])} for a timing"
            )
        from . import memory, profiled

        m = Measured(
            device=str(self.device.type if self.device is not None else "cpu"),
            step_s=statistics.median(timed.times),
            mean_step_s=(timed.t1 - timed.t0) / len(timed.times),
            step_spread_s=spread(timed.times),
            best_step_s=min(timed.times),
            steps=self.steps,
            batch_size=batch_size,
            loader=loader,
            threads=torch.get_num_threads(),
            workers=self.workers_seen if workers is None else workers,
            cores=processes.usable_cores(),
            steps_needed=sum(self.named_window(n).steps for n in MEASURING),
        )
        m.step_counting = self.step_counting()
        if loader is not None:  # the in-notebook form timed next() itself, in the timed window
            m.wait_s = statistics.median(timed.waits)
        profiled.read(self, m)
        memory.read(self, m)
        for w in self.trial_windows:
            if not w.warmup and w.t1:
                step = (w.t1 - w.t0) / len(w.times)  # a speed: the mean, as throughput_step_s
                m.trials[w.name] = Trial(w.name, (w.batch or batch_size or 0) / step, step)
        return m
