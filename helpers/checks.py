"""Argument checks with one wording: `<where>: <name> must be <what>, got <value>` (`where`: the
function or class). Bools are no numbers here: `True` is an int to Python, never to a learner."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def _fail(where: str, name: str, what: str, value: Any) -> ValueError:
    return ValueError(f"{where + ': ' if where else ''}{name} must be {what}, got {value!r}")


def check_int(
    name: str, value: Any, low: int = 1, *, where: str = "", allow_none: bool = False
) -> int | None:
    """`value` if it is an int >= `low` (or None when `allow_none`), else a ValueError."""
    if allow_none and value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise _fail(where, name, f"an int >= {low}" + (" or None" if allow_none else ""), value)
    return value


def check_number(
    name: str,
    value: Any,
    *,
    where: str = "",
    low: float = 0.0,
    inclusive: bool = False,
    allow_none: bool = False,
    what: str = "",
) -> float | None:
    """`value` as a float if it is a finite number > `low` (>= with `inclusive`), else a ValueError
    naming `what` it must be: NaN and infinity never pass (an endless budget hangs)."""
    if allow_none and value is None:
        return None
    if not (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value >= low if inclusive else value > low)
    ):
        what = what or (
            "a positive finite number"
            if low == 0 and not inclusive
            else f"a finite number {'>=' if inclusive else '>'} {low:g}"
        )
        raise _fail(where, name, what + (" or None" if allow_none else ""), value)
    return float(value)


def check_seconds(name: str, value: Any, *, where: str = "") -> float:
    """A positive, finite number of seconds (a deadline or a budget)."""
    return check_number(name, value, where=where, what="a positive finite number of seconds")


def check_choice(name: str, value: Any, choices: Iterable[Any], *, where: str = "") -> Any:
    """`value` if it is one of `choices`, else a ValueError listing them."""
    if value not in (options := tuple(choices)):
        raise _fail(where, name, "one of " + ", ".join(repr(c) for c in options), value)
    return value
