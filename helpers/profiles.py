"""Run profiles: how big a run is.

- `smoke`: seconds per notebook on a 2-core CPU (tests, CI, a laptop without a GPU).
- `gpu`: the default on an accelerator (CUDA, an Apple GPU through MPS, XPU; Colab's or Kaggle's
  free T4 counts). Its sizes are bounded: a notebook gives a `gpu=` size where the lesson needs
  more work than the smoke size, and the step counts of its timed comparisons come from
  `Profile.steps`, which times a few steps of the baseline on the device in hand and picks the
  count that fills a stated number of seconds. So no GPU, slow or fast, stretches a notebook
  past its budget (`notebooks/catalog.toml`).
- `full`: the paper sizes (50,000 images, epochs of the whole data set); opt-in, long.

A notebook's parameters cell picks each size from the active profile::

    profile = profiles.active()
    WIDTH = profile.pick(smoke=8, gpu=64, full=64, what="model width")
    STEPS = profile.steps(lambda: train_step(), seconds=10, smoke=5, full=500, what="timed steps")
    profile.describe()   # says what this profile changed, and how the step counts were sized

The profile comes from `FTG_PROFILE`; `auto` (the default) picks `gpu` when an accelerator is
present, else `smoke`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .checks import check_choice

PROFILES = ("smoke", "gpu", "full")
ENV_VAR = "FTG_PROFILE"
_SMOKE_SIZE = object()  # `pick(gpu=...)` not given: the gpu profile keeps the smoke size


def choose(name: str | None = None, given: str = "asked for") -> tuple[str, str]:
    """`name` (else `$FTG_PROFILE`, else `auto`) as one of PROFILES, and why (`given`: what
    to say of a `name` passed in)."""
    reason = given
    if name is None:
        name, reason = (
            (os.environ[ENV_VAR], f"from the environment ({ENV_VAR})")
            if os.environ.get(ENV_VAR)
            else ("auto", "the default")
        )
    if not isinstance(name, str):
        raise TypeError(
            f"profile must be a string, one of {', '.join(PROFILES)}, auto; got {name!r}"
        )
    name = check_choice(f"profile (or ${ENV_VAR})", name.strip().lower(), (*PROFILES, "auto"))
    if name == "auto":
        from helpers import devices

        if devices.accelerator():
            name, reason = "gpu", f"{reason}, auto: a GPU is present (sizes bounded by time)"
        else:
            name, reason = "smoke", f"{reason}, auto: no GPU here"
    return name, reason


@dataclass
class Profile:
    """The active profile, and a log of what it changed so notebooks can say so."""

    name: str
    shrunk: list[str] = field(default_factory=list)
    sized: list[str] = field(default_factory=list)
    plan: list[dict[str, Any]] = field(default_factory=list)  # each timed loop `steps` sized

    def __post_init__(self) -> None:
        if self.name not in PROFILES:
            raise ValueError(
                f"Profile: name must be one of {', '.join(PROFILES)} (use profiles.active() "
                f"to resolve 'auto'); got {self.name!r}"
            )

    @property
    def is_smoke(self) -> bool:
        return self.name == "smoke"

    def pick(
        self, *, smoke: Any, full: Any, gpu: Any = _SMOKE_SIZE, what: str | None = None
    ) -> Any:
        """This profile's value (the gpu profile: `gpu`, else the smoke size); remember what a
        size smaller than the full one was, so `describe` can say so."""
        if self.name == "full":
            return full
        value = smoke if self.is_smoke or gpu is _SMOKE_SIZE else gpu
        entry = f"{what}: {value} (full profile: {full})"
        if what and value != full and entry not in self.shrunk:  # a size re-picked: said once
            self.shrunk.append(entry)
        return value

    def steps(
        self,
        step: Callable[[], object] | None = None,
        *,
        seconds: float,
        smoke: int,
        full: int,
        what: str,
        runs: int = 1,
        least: int | None = None,
        make_step: Callable[[], Callable[[], object]] | None = None,
        step_seconds: float | None = None,
    ) -> int:
        """How many steps of `step` the timed part runs: `smoke` or `full` in those profiles; in
        the gpu profile as many as fill `seconds` on this device, between `least` (default: `smoke`)
        and `full`.

        The count is fixed from the baseline's step time before anything is timed, and the
        technique then runs the same count: equal work stays the rule. `runs`: how many times
        the notebook runs that many steps (variants x repeats, warm-ups included), recorded in
        `plan` with the count and step time so a budget can be checked. `make_step` instead of
        `step`: a function that builds the step, called only when the step is timed (so nothing
        is put on the device where the count needs no measurement). `step_seconds` states the
        step time instead of measuring it (tests, or a figure the notebook already measured)."""
        least = self._check_steps(step, make_step, seconds, smoke, full, runs, least)
        plan = {"what": what, "runs": runs, "step_seconds": None, "calibration_steps": 0}
        if self.name != "gpu":
            plan["count"] = self.pick(smoke=smoke, full=full, what=what)
            self.plan.append(plan)
            return plan["count"]
        if step_seconds is None:
            step_seconds = _time_one_step(step, make_step, what)
            plan["calibration_steps"] = 4  # the calibration's own steps: one warm-up, three timed
        if not (isinstance(step_seconds, (int, float)) and step_seconds > 0):
            raise ValueError(
                f"Profile.steps: step_seconds must be a positive number, got {step_seconds!r}"
            )
        count = min(full, max(least, math.floor(seconds / step_seconds)))
        self.sized.append(
            f"{what}: {count} (one step took {step_seconds * 1e3:.3g} ms here, so about "
            f"{count * step_seconds:.3g} s of the {seconds:g} s asked for; bounds {least}..{full})"
        )
        print(f"sized on this device: {self.sized[-1]}")  # before the long cell it sizes
        self.plan.append({**plan, "count": count, "step_seconds": step_seconds})
        return count

    @staticmethod
    def _check_steps(step, make_step, seconds, smoke, full, runs, least) -> int:
        """`steps`' arguments checked, each bad one named; the fewest steps (`least`)."""
        if (step is None) == (make_step is None) or not callable(step or make_step):
            raise TypeError("Profile.steps: give one function, step or make_step")
        if not (isinstance(runs, int) and runs >= 1):
            raise ValueError(f"Profile.steps: runs must be a whole number >= 1, got {runs!r}")
        if not (isinstance(seconds, (int, float)) and seconds > 0):
            raise ValueError(f"Profile.steps: seconds must be a positive number, got {seconds!r}")
        if not (isinstance(smoke, int) and isinstance(full, int) and 1 <= smoke <= full):
            raise ValueError(
                f"Profile.steps: smoke and full must be whole numbers with 1 <= smoke <= full, "
                f"got smoke={smoke!r}, full={full!r}"
            )
        least = smoke if least is None else least
        if not (isinstance(least, int) and 1 <= least <= smoke):
            raise ValueError(f"Profile.steps: least must be in 1..smoke, got {least!r}")
        return least

    def planned_seconds(self) -> float:
        """Seconds of the work `steps` sized: count x runs x step time, and the calibration's
        own steps, summed (the gpu profile; a count not sized by time is not counted)."""
        return sum(
            (p["count"] * p["runs"] + p["calibration_steps"]) * (p["step_seconds"] or 0)
            for p in self.plan
        )

    def describe(self) -> str:
        """Print (and return) which profile runs, what it changed and how it sized the steps."""
        lines = [f"Profile: {self.name}"]
        if self.is_smoke:
            lines.append("  smoke profile: sizes shrunk so the notebook runs in seconds on a CPU.")
        elif self.name == "gpu":
            lines.append(
                "  gpu profile: sizes bounded so the notebook ends within its budget on any GPU;"
                " step counts sized by time on this device."
            )
        lines += [f"  - {s}" for s in self.shrunk + self.sized]
        if self.name != "full":
            lines.append(
                "  FTG_PROFILE=full (make run PROFILE=full) runs the paper sizes: long (hours on"
                " a small GPU)."
            )
        print("\n".join(lines))
        return "\n".join(lines)


def active(name: str | None = None) -> Profile:
    """The profile to run with: `name`, else `$FTG_PROFILE`, else auto-detected."""
    return Profile(choose(name)[0])


def _time_one_step(
    step: Callable[[], object] | None,
    make_step: Callable[[], Callable[[], object]] | None,
    what: str,
) -> float:
    """The median of three timed calls after a warm-up; `make_step` builds the step on the first
    (warm-up) call, so nothing is put on the device before a count needs a measurement."""
    from helpers import timing  # imports torch: only when a notebook sizes a step

    if step is None:
        built: list[Callable[[], object]] = []

        def step() -> object:
            if not built:
                built.append(make_step())
            return built[0]()

    return timing.benchmark(step, repeats=3, warmup=1, label=what).median
