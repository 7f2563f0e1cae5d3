"""The gpu profile: the default on an accelerator, sized by time so no GPU stretches a notebook.

The calibration is fed stated step times (a described T4, a described H100, a device 10x slower):
the count it picks must keep the timed part within the seconds asked for, shrink on a slower
device, and stay within the smoke and full bounds.
"""

import pytest

from helpers import profiles

# Seconds per training step of one baseline, stated for two GPUs (orders of magnitude apart,
# as a small ResNet step is on a T4 and an H100): the sizing must hold for any such figure.
STATED_STEP_SECONDS = {"T4": 0.040, "H100": 0.004, "T4, 10x slower": 0.40}


@pytest.mark.parametrize("device", STATED_STEP_SECONDS)
@pytest.mark.parametrize("seconds", [2, 10, 30])
def test_sized_steps_fill_at_most_the_seconds_asked_for(device, seconds):
    step_s = STATED_STEP_SECONDS[device]
    p = profiles.Profile("gpu")
    n = p.steps(
        lambda: None, seconds=seconds, smoke=3, full=100_000, what="steps", step_seconds=step_s
    )
    assert 3 <= n <= 100_000
    assert n * step_s <= seconds or n == 3  # over only when even the smoke count takes longer
    assert f"steps: {n} (one step took" in p.describe()


def test_a_slower_device_gets_fewer_steps_never_more_time():
    fast, slow = (
        profiles.Profile("gpu").steps(
            lambda: None, seconds=20, smoke=2, full=10**6, what="s", step_seconds=t
        )
        for t in (0.004, 0.04)
    )
    assert slow < fast and slow * 0.04 <= 20 and fast * 0.004 <= 20


def test_bounds_hold_at_both_ends():
    p = profiles.Profile("gpu")
    kw = dict(seconds=10, smoke=5, full=50, what="steps")
    assert p.steps(lambda: None, step_seconds=1e-6, **kw) == 50  # fast: capped at the full size
    assert p.steps(lambda: None, step_seconds=100.0, **kw) == 5  # slow: never below smoke


def test_smoke_and_full_do_not_calibrate():
    calls = []
    kw = dict(seconds=10, smoke=5, full=50, what="steps")
    assert profiles.Profile("smoke").steps(lambda: calls.append(1), **kw) == 5
    assert profiles.Profile("full").steps(lambda: calls.append(1), **kw) == 50
    assert calls == []


def test_the_calibration_times_the_step_when_no_time_is_stated():
    calls = []
    p = profiles.Profile("gpu")
    n = p.steps(lambda: calls.append(1), seconds=0.5, smoke=1, full=20, what="steps")
    assert len(calls) == 4 and n == 20  # one warm-up and three timed calls; instant: the cap


def test_gpu_pick_keeps_the_smoke_size_unless_a_gpu_size_is_given():
    p = profiles.Profile("gpu")
    assert p.pick(smoke=2, full=100, what="epochs") == 2
    assert p.pick(smoke=16, gpu=64, full=256, what="width") == 64
    assert p.pick(smoke=16, gpu=256, full=256, what="depth") == 256
    text = p.describe()
    assert "epochs: 2 (full profile: 100)" in text and "width: 64 (full profile: 256)" in text
    assert "depth" not in text  # the full size: nothing changed to report


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(seconds=0, smoke=1, full=2), "seconds must be a positive number"),
        (dict(seconds=1, smoke=3, full=2), "1 <= smoke <= full"),
        (dict(seconds=1, smoke=1, full=2, step_seconds=-1.0), "step_seconds must be a positive"),
    ],
)
def test_bad_sizing_input_names_the_parameter(kw, match):
    with pytest.raises(ValueError, match=match):
        profiles.Profile("gpu").steps(lambda: None, what="steps", **kw)


def test_a_size_picked_again_by_steps_is_reported_once():
    p = profiles.Profile("smoke")
    steps = p.pick(smoke=2, full=50, what="steps per epoch")
    assert p.steps(lambda: None, seconds=1, smoke=steps, full=50, what="steps per epoch") == 2
    assert p.describe().count("steps per epoch: 2 (full profile: 50)") == 1
