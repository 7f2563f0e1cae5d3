import time

import pytest

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
