"""The in-notebook form: `for X, y in doctor.watch(loader): ...` around a learner's own loop.

The doctor holds the loader, so beside watching it can *try* fixes on the loop itself: a few
steps with the loader rebuilt with workers, at twice the batch, or with fewer threads; each
trial's speed is the predicted speed of the fix. The loop stops when the doctor has seen
enough (the steps it watched are real training steps on real batches).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import sys
import time
import types
import weakref
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader

from . import rules
from .session import WARMUP_PER_WORKER, Session, Window


class Watch:
    """Iterate it like the loader; the diagnosis is printed when the loop ends (`.findings`)."""

    def __init__(
        self,
        loader: DataLoader,
        *,
        timed: int = 8,
        trial_steps: int = 4,
        seconds: float = 0.3,
        what_if: bool = True,
        quiet: bool = False,
    ) -> None:
        if not isinstance(loader, DataLoader):
            raise TypeError(
                f"watch: loader must be a torch.utils.data.DataLoader, got {type(loader).__name__}"
            )
        if not isinstance(timed, int) or timed < 3:
            raise ValueError(f"watch: timed must be an int >= 3, got {timed!r}")
        self.loader, self.what_if, self.quiet = loader, what_if, quiet
        self.batch = batch_size(loader)
        if (
            not isinstance(seconds, int | float)
            or isinstance(seconds, bool)
            or not 0 <= seconds < 3600
        ):
            raise ValueError(
                f"watch: seconds must be a number of seconds in [0, 3600), got {seconds!r}"
            )
        # The session holds the what-ifs' planner without holding this watch: a cycle between
        # the two would keep the loader, and a persistent loader's worker processes, alive after
        # the learner drops them, until a garbage collection at some later step (whose join of
        # the workers then stalled that step for seconds).
        plan = weakref.WeakMethod(self._trials)
        self.session = Session(
            workers=loader.num_workers,
            timed=timed,
            trial_steps=trial_steps,
            seconds=float(seconds),
            trials=lambda session: plan()(session),
        )
        self.source: DataLoader = loader
        self.blocked: str | None = None  # why workers could not load the data set, once asked
        self.measured: rules.Measured | None = None
        self.findings: list[rules.Finding] = []

    def __iter__(self) -> Iterator:
        s = self.session.start()
        source, batches, threads = self.source, 0, torch.get_num_threads()
        it = iter(source)
        try:
            while not s.done:
                if self.source is not source:  # a what-if began or ended
                    source, it = self.source, iter(self.source)
                t0 = time.perf_counter()
                if s.counter is not None:
                    s.counter.paused = True  # loading is not the step
                batch = next(it, None)
                if batch is None:  # an epoch ended: the next one
                    it = iter(source)
                    batch = next(it)
                if s.counter is not None:
                    s.counter.paused = False
                s.note_wait(time.perf_counter() - t0)
                batches += 1
                if s.opt is None and batches > 3 * sum(w.steps for w in s.windows) + 10:
                    raise RuntimeError(
                        "watch: no optimizer step in the loop after "
                        f"{batches} batches; the doctor counts optimizer.step()"
                    )
                yield batch
        finally:
            s.close()
            torch.set_num_threads(threads)
            self.source = self.loader
        self.report()

    def report(self) -> list[rules.Finding]:
        self.measured = self.session.measured(
            self.batch, loader_settings(self.loader), self.loader.num_workers
        )
        if rules.input_bound(self.measured):  # its fix is workers: can they load the data set?
            self.measured.workers_blocked = self._workers_blocked()
        self.findings = rules.findings(self.measured)
        if not self.quiet:
            from .text import render

            print(render(self.measured, self.findings))
        return self.findings

    # --- the what-ifs ------------------------------------------------------------------------
    def _trials(self, s: Session) -> list[Window]:
        if not self.what_if:
            return []
        m = s.measured(self.batch, loader_settings(self.loader), self.loader.num_workers)
        out: list[Window] = []
        if (
            rules.input_bound(m)
            and self.loader.num_workers < m.cores
            and self._workers_blocked() is None  # else reported, not tried: they would crash
        ):
            k = m.cores
            out += s.trial(
                "workers",
                lambda: self._use(rebuild(self.loader, num_workers=k)),
                self._restore,
                self.batch,
                warmup=2 + WARMUP_PER_WORKER * k,
            )
        if rules.overhead_bound(m) or rules.device_idle(m):
            b = 2 * (self.batch or 1)
            out += s.trial(
                "batch x2", lambda: self._use(rebuild(self.loader, batch_size=b)), self._restore, b
            )
        if rules.oversubscribed(m):
            before = torch.get_num_threads()
            out += s.trial(
                "threads",
                lambda: torch.set_num_threads(m.fair_threads()),
                lambda: torch.set_num_threads(before),
                self.batch,
            )
        return out

    def _workers_blocked(self) -> str | None:
        if self.blocked is None:
            self.blocked = workers_cannot_load(self.loader) or ""
        return self.blocked or None

    def _use(self, loader: DataLoader) -> None:
        self.source = loader

    def _restore(self) -> None:
        self.source = self.loader


def batch_size(loader: DataLoader) -> int | None:
    """Samples per batch: the loader's, or its sampler's when the sampler makes the batches."""
    if loader.batch_size is not None:
        return loader.batch_size
    return getattr(loader.sampler, "batch_size", None)


def loader_settings(loader: DataLoader) -> dict:
    return {
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "persistent_workers": loader.persistent_workers,
        "batch_size": batch_size(loader),
    }


def rebuild(loader: DataLoader, **change: object) -> DataLoader:
    """The learner's loader with some settings changed (same data set, collate, drop_last)."""
    kw = dict(
        batch_size=loader.batch_size,
        shuffle=False,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        worker_init_fn=loader.worker_init_fn,
    )
    size = change.pop("batch_size", None)
    if loader.batch_size is None:  # the sampler makes the batches: keep it, resized if asked
        smp = loader.sampler
        kw["sampler"] = smp if size is None else type(smp)(smp.sampler, size, smp.drop_last)
    elif size is not None:
        kw["batch_size"] = size
    kw.update(change)
    if kw["num_workers"]:  # started as the learner's own workers would be
        kw["persistent_workers"] = True
        kw["multiprocessing_context"] = loader.multiprocessing_context
    return DataLoader(loader.dataset, **kw)


# Start methods whose workers import what they run and receive it pickled (not a fork's copy).
IMPORTING = ("spawn", "forkserver")


def start_method(loader: DataLoader) -> str:
    """How the loader's workers start: its `multiprocessing_context`, else the process's start
    method, else the platform's default (asked without fixing it)."""
    ctx = loader.multiprocessing_context
    if ctx is not None:
        return ctx.get_start_method()
    return mp.get_start_method(allow_none=True) or mp.get_all_start_methods()[0]


def main_importable() -> bool:
    """Whether a spawned process can import this one's `__main__`: multiprocessing runs a `-m`
    module or a script's file again there; a notebook, `python -c` or a REPL has neither."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None):
        return True
    path = getattr(main, "__file__", None)
    return bool(path) and os.path.isfile(path)


class _MainRefs(pickle.Pickler):
    """Pickles to nowhere, noting the classes and functions it would send by a `__main__` name;
    tensors and arrays are skipped (data, not code; pickled by shared memory anyway)."""

    class _Sink:
        write = staticmethod(len)

    def __init__(self) -> None:
        super().__init__(self._Sink(), protocol=pickle.HIGHEST_PROTOCOL)
        self.found: list[str] = []

    def persistent_id(self, obj: object) -> object:
        return 1 if isinstance(obj, torch.Tensor | np.ndarray) else None

    def reducer_override(self, obj: object) -> object:
        if isinstance(obj, type | types.FunctionType) and obj.__module__ == "__main__":
            self.found.append(obj.__qualname__)
        return NotImplemented


def workers_cannot_load(loader: DataLoader) -> str | None:
    """Why workers of this loader could not load its data set (None: they can). Under `spawn`
    or `forkserver` a worker unpickles the data set, collate_fn and worker_init_fn: a class
    or function defined in an unimportable `__main__` (a notebook cell) fails there with
    "Can't get attribute ... on <module '__main__'>"; an unpicklable one fails here."""
    method = start_method(loader)
    if method not in IMPORTING:
        return None
    refs = _MainRefs()
    parts = {"dataset": loader.dataset, "collate_fn": loader.collate_fn}
    parts["worker_init_fn"] = loader.worker_init_fn
    for what, obj in parts.items():
        try:
            refs.dump(obj)
        except Exception as e:  # whatever the worker's pickling would raise
            return (
                f"DataLoader workers start by {method!r} here and receive the {what} pickled, "
                f"and it cannot be pickled ({type(e).__name__}: {e}); a worker would fail"
            )
    if not refs.found or main_importable():
        return None
    names = ", ".join(dict.fromkeys(refs.found))
    return (
        f"DataLoader workers start by {method!r} here: they import the code they run, and "
        f"{names} is defined in __main__ (a notebook cell, python -c), which they cannot "
        "import: each worker would fail with \"Can't get attribute ... on <module '__main__'>\""
    )


def watch(
    loader: DataLoader,
    *,
    timed: int = 8,
    trial_steps: int = 4,
    seconds: float = 0.3,
    what_if: bool = True,
    quiet: bool = False,
) -> Watch:
    """Watch a training loop over `loader`: `for batch in doctor.watch(loader): ...`.

    timed: steps timed with nothing but a clock; trial_steps: steps timed per what-if;
    seconds: the least time each timed window lasts (short steps need many for a steady median);
    what_if: try the fixes on the loop itself (a rebuilt loader, twice the batch, fewer
    threads); quiet: do not print the diagnosis (read `.findings`)."""
    return Watch(
        loader, timed=timed, trial_steps=trial_steps, seconds=seconds, what_if=what_if, quiet=quiet
    )
