"""helpers.checks: one wording, the parameter named, bools/NaN/inf refused."""

import math

import pytest

from helpers import checks


def test_check_int_accepts_and_returns():
    assert checks.check_int("n", 3) == 3
    assert checks.check_int("n", 0, 0) == 0
    assert checks.check_int("n", None, allow_none=True) is None


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "2", None])
def test_check_int_refuses_with_the_name(bad):
    with pytest.raises(ValueError, match=r"^train: batch_size must be an int >= 1, got "):
        checks.check_int("batch_size", bad, where="train")


def test_check_number():
    assert checks.check_number("lr", 0.1) == 0.1
    assert checks.check_number("x", 0, inclusive=True) == 0.0
    for bad in (0, -1.0, math.nan, math.inf, True, "1"):
        with pytest.raises(ValueError, match="lr must be a positive finite number"):
            checks.check_number("lr", bad)
    with pytest.raises(ValueError, match=r"x must be a finite number >= 0, got -1"):
        checks.check_number("x", -1, inclusive=True)


def test_check_seconds_refuses_infinity_and_nan():
    assert checks.check_seconds("timeout", 2) == 2.0
    for bad in (0, math.inf, math.nan, False):
        with pytest.raises(ValueError, match="timeout must be a positive finite number of seconds"):
            checks.check_seconds("timeout", bad)


def test_check_choice_lists_the_options():
    assert checks.check_choice("mode", "a", ("a", "b")) == "a"
    with pytest.raises(ValueError, match=r"mode must be one of 'a', 'b', got 'c'"):
        checks.check_choice("mode", "c", ("a", "b"))
