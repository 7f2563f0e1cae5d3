import time

import pytest

from helpers import data_wait
from helpers.data_wait import DataWaitMeter


def slow_source(n, delay):
    for i in range(n):
        time.sleep(delay)
        yield i


def test_input_bound_loop_is_diagnosed():
    meter = DataWaitMeter(slow_source(5, 0.03))
    for _ in meter:
        time.sleep(0.003)
    s = meter.summary()
    assert s["steps"] == 5 and s["wait_fraction"] > 0.6
    assert "input-bound" in meter.diagnosis()


def test_compute_bound_loop_is_diagnosed():
    meter = DataWaitMeter(range(5))
    for _ in meter:
        time.sleep(0.02)
    assert meter.summary()["wait_fraction"] < 0.1
    assert "compute-bound" in meter.diagnosis()


def test_bad_sync_every():
    with pytest.raises(ValueError, match="sync_every"):
        DataWaitMeter([], sync_every=0)


def test_skip_leaves_out_the_first_steps():
    def source():
        time.sleep(0.2)  # a slow first batch, like a DataLoader starting its workers
        yield from range(4)

    meter = DataWaitMeter(source())
    for _ in meter:
        time.sleep(0.01)
    assert meter.summary()["wait_fraction"] > 0.5
    steady = meter.summary(skip=1)
    assert steady["steps"] == 3 and steady["wait_fraction"] < 0.2
    assert steady["step_s"] == pytest.approx((steady["wait_s"] + steady["compute_s"]) / 3)
    with pytest.raises(ValueError, match="skip must be an int >= 0"):
        meter.summary(skip=-1)


@pytest.mark.parametrize("wait", [0.0, 0.05, data_wait.NOTICEABLE, 0.2, data_wait.INPUT_BOUND - 1e-9,
                                  data_wait.INPUT_BOUND, 0.9])
def test_wait_verdict_either_side_of_its_thresholds(wait):
    kind, sentence = data_wait.wait_verdict(wait)
    expected = ("input-bound" if wait >= data_wait.INPUT_BOUND else
                "noticeable" if wait >= data_wait.NOTICEABLE else "not input-bound")
    assert kind == expected and f"{100 * wait:.0f} %" in sentence
