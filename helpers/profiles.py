"""Run profiles: `smoke` (seconds per notebook on a 2-core CPU) and `full` (real sizes, for a GPU).

A notebook's parameters cell picks each size from the active profile::

    P = profiles.active()
    STEPS = P.pick(smoke=5, full=500, what="training steps")
    P.describe()   # says what the smoke profile shrank

The profile comes from `FTG_PROFILE`; `auto` (the default) picks `full` when a GPU is present
(CUDA, an Apple GPU through MPS, or XPU; Colab's or Kaggle's free T4 counts), else `smoke`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .checks import check_choice

PROFILES = ("smoke", "full")
ENV_VAR = "FTG_PROFILE"


def choose(name: str | None = None, given: str = "asked for") -> tuple[str, str]:
    """`name` (else `$FTG_PROFILE`, else `auto`) as `smoke` or `full`, and why (`given`: what
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

        name, reason = (
            ("full", f"{reason}, auto: a GPU is present")
            if devices.accelerator()
            else ("smoke", f"{reason}, auto: no GPU here")
        )
    return name, reason


@dataclass
class Profile:
    """The active profile, and a log of what it shrank so notebooks can say so."""

    name: str
    shrunk: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.name not in PROFILES:
            raise ValueError(
                f"Profile: name must be one of {', '.join(PROFILES)} (use profiles.active() "
                f"to resolve 'auto'); got {self.name!r}"
            )

    @property
    def is_smoke(self) -> bool:
        return self.name == "smoke"

    def pick(self, *, smoke: Any, full: Any, what: str | None = None) -> Any:
        """This profile's value; in the smoke profile, remember that `what` was shrunk."""
        if self.is_smoke and what and smoke != full:
            self.shrunk.append(f"{what}: {smoke} (full profile: {full})")
        return smoke if self.is_smoke else full

    def describe(self) -> str:
        """Print (and return) which profile runs, and what it changed."""
        lines = [f"Profile: {self.name}"]
        if self.is_smoke:
            lines.append("  smoke profile: sizes shrunk so the notebook runs in seconds on a CPU.")
            lines += [f"  - {s}" for s in self.shrunk]
            lines.append("  Run with FTG_PROFILE=full (make run PROFILE=full) for the real sizes.")
        print("\n".join(lines))
        return "\n".join(lines)


def active(name: str | None = None) -> Profile:
    """The profile to run with: `name`, else `$FTG_PROFILE`, else auto-detected."""
    return Profile(choose(name)[0])
