"""Run profiles: `smoke` (seconds per notebook on a 2-core CPU) and `full` (real sizes, for a GPU).

A notebook's parameters cell reads the active profile and picks each size from it::

    P = profiles.active()
    STEPS = P.pick(smoke=5, full=500, what="training steps")
    P.describe()   # says what the smoke profile shrank

The profile comes from the `FTG_PROFILE` environment variable; `auto` (the default) picks
`full` when a GPU is present (CUDA, an Apple GPU through MPS, or XPU; on Colab or Kaggle the
free T4 counts) and `smoke` otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .checks import check_choice

PROFILES = ("smoke", "full")
_CHOICES = (*PROFILES, "auto")
ENV_VAR = "FTG_PROFILE"


def choose(name: str | None = None, given: str = "asked for") -> tuple[str, str]:
    """`name` (else `$FTG_PROFILE`, else `auto`) as `smoke` or `full`, and the reason it was chosen
    (`given`: what to say of a `name` passed in)."""
    reason = given
    if name is None:
        name, reason = ((os.environ[ENV_VAR], f"from the environment ({ENV_VAR})") if os.environ.get(ENV_VAR)
                        else ("auto", "the default"))
    if not isinstance(name, str):
        raise TypeError(f"profile must be a string, one of {', '.join(_CHOICES)}; got {name!r}")
    name = check_choice(f"profile (or ${ENV_VAR})", name.strip().lower(), _CHOICES)
    if name == "auto":
        from helpers import devices

        name, reason = ("full", f"{reason}, auto: a GPU is present") if devices.accelerator() \
            else ("smoke", f"{reason}, auto: no GPU here")
    return name, reason


def resolve(name: str | None = None) -> str:
    """Turn a profile name (or `None` = the environment's, or `auto`) into `smoke` or `full`."""
    return choose(name)[0]


@dataclass
class Profile:
    """The active profile, and a log of what it shrank so notebooks can say so."""

    name: str
    shrunk: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.name not in PROFILES:
            raise ValueError(f"Profile: name must be one of {', '.join(PROFILES)} (use profiles.active() "
                             f"to resolve 'auto'); got {self.name!r}")

    @property
    def is_smoke(self) -> bool:
        return self.name == "smoke"

    def pick(self, *, smoke: Any, full: Any, what: str | None = None) -> Any:
        """Return the value for this profile; remember `what` was shrunk in the smoke profile."""
        value = smoke if self.is_smoke else full
        if self.is_smoke and what and smoke != full:
            self.shrunk.append(f"{what}: {smoke} (full profile: {full})")
        return value

    def describe(self) -> str:
        """One paragraph for the notebook output: which profile, and what it changed."""
        lines = [f"Profile: {self.name}"]
        if self.is_smoke:
            lines.append("  smoke profile: sizes shrunk so the notebook runs in seconds on a CPU.")
            lines += [f"  - {s}" for s in self.shrunk]
            lines.append("  Run with FTG_PROFILE=full (make run PROFILE=full) for the real sizes.")
        text = "\n".join(lines)
        print(text)
        return text


def active(name: str | None = None) -> Profile:
    """The profile to run with: `name`, else `$FTG_PROFILE`, else auto-detected."""
    return Profile(resolve(name))
