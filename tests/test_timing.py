import threading
import time

import pytest
import torch

import helpers.timing as timing
from helpers.timing import Timer, benchmark


def test_benchmark_measures_a_known_sleep():
    m = benchmark(lambda: time.sleep(0.05), repeats=5, warmup=1)
    assert len(m.times) == 5
    assert 0.045 <= m.median
    assert m.median < 0.5  # a loaded machine oversleeps a little, never by 10x
    assert m.min <= m.median and m.iqr >= 0
    assert m.per_second(10) == pytest.approx(10 / m.median)


def test_benchmark_number_gives_per_call_time():
    m = benchmark(lambda: time.sleep(0.01), repeats=3, warmup=0, number=10)
    # per call (>= 0.01 s), not per block of 10 calls (>= 0.1 s), however loaded the machine
    assert 0.009 <= m.median < 0.05


class _FakeAsyncDevice:
    """Work 'queued' by fn finishes on another thread; synchronize() waits for it, like CUDA."""

    def __init__(self):
        self.pending: list[threading.Thread] = []

    def launch(self, seconds):
        t = threading.Thread(target=time.sleep, args=(seconds,))
        t.start()
        self.pending.append(t)  # returns at once, as a kernel launch does

    def synchronize(self, *_):
        for t in self.pending:
            t.join()
        self.pending.clear()


def test_benchmark_waits_for_queued_work(monkeypatch):
    dev = _FakeAsyncDevice()
    monkeypatch.setattr(timing, "synchronize", dev.synchronize)
    m = benchmark(lambda: dev.launch(0.05), repeats=3, warmup=1)
    assert m.median >= 0.045, "an unsynchronised clock would read ~0 s here"


def test_timer_waits_for_queued_work(monkeypatch):
    dev = _FakeAsyncDevice()
    monkeypatch.setattr(timing, "synchronize", dev.synchronize)
    t = Timer()
    with t:
        dev.launch(0.05)
    assert t.times[-1] >= 0.045


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")
def test_gpu_op_is_not_under_timed():
    a = torch.randn(4096, 4096, device="cuda")
    a @ a  # warm up first: the events must not time cuBLAS's one-off start (2.7x the steady step)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        a @ a
    end.record()
    torch.cuda.synchronize()
    event_s = start.elapsed_time(end) / 1000
    m = benchmark(lambda: [a @ a for _ in range(20)], repeats=3)
    assert m.median >= 0.8 * event_s


def test_timer_like_d2l():
    t = Timer()
    for s in (0.01, 0.02):
        t.start()
        time.sleep(s)
        t.stop()
    assert len(t.times) == 2
    assert 0.009 <= t.times[0] <= 0.05 and t.times[0] < t.times[1]


def test_bad_input():
    with pytest.raises(ValueError, match="repeats"):
        benchmark(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        benchmark(lambda: None, warmup=-1)
    with pytest.raises(TypeError, match="callable"):
        benchmark(42)
    t = Timer()
    t.stop()
    with pytest.raises(RuntimeError, match="before start"):
        t.stop()


def test_benchmark_calls_fn_exactly_warmup_plus_repeats_times_number():
    calls = []
    benchmark(lambda: calls.append(1), repeats=3, warmup=2, number=4)
    assert len(calls) == 2 + 3 * 4  # no hidden extra warm-up calls inside timed runs


def test_benchmark_keeps_the_thread_count():
    seen = []
    before = torch.get_num_threads()
    benchmark(lambda: seen.append(torch.get_num_threads()), repeats=2, warmup=0)
    assert set(seen) == {before}


def test_benchmark_reports_its_window_and_device():
    """The timed window is `number` calls, not one: what a claim's window floor is checked on."""
    m = benchmark(lambda: time.sleep(0.002), repeats=3, warmup=0, number=5)
    assert m.window == pytest.approx(5 * m.min, rel=1e-9) and m.window >= 0.01
    assert m.max >= m.median >= m.min
    assert m.device == ("cpu" if timing.accelerator() is None else None)
    assert benchmark(lambda: None, repeats=2, device="cpu").device == "cpu"


def test_a_measurement_of_times_taken_elsewhere():
    m = timing.measurement([0.3, 0.1, 0.2], "steps", device="cpu")
    assert (m.median, m.min, m.max, m.window, m.device) == (0.2, 0.1, 0.3, 0.1, "cpu")
    assert timing.measurement([2.0], window=0.5).window == 0.5  # scaled from a shorter window
    with pytest.raises(ValueError, match="non-empty list of seconds"):
        timing.measurement([])


def test_a_ratio_carries_its_range_over_the_repeats_and_its_windows():
    a = timing.measurement([0.30, 0.33, 0.36], "a", device="cpu")
    b = timing.measurement([0.10, 0.11, 0.12], "b", device="cuda")
    r = timing.ratio(a, b)
    assert float(r) == pytest.approx(0.33 / 0.11)
    assert (r.low, r.high) == (pytest.approx(0.30 / 0.12), pytest.approx(0.36 / 0.10))
    assert r.windows == ((0.30, "cpu"), (0.10, "cuda")) and r.window == 0.10
    assert f"{r:.1f}" == "3.0" and 2 * r == pytest.approx(0.66 / 0.11)  # a number as before
    saved = 1 - timing.ratio(b, a)  # a share of time saved: the range turns over
    assert (saved.low, saved.high) == (
        pytest.approx(1 - 0.12 / 0.30),
        pytest.approx(1 - 0.1 / 0.36),
    )
    # stages that add up, and a number: one window of that many seconds
    s = timing.ratio((a, b), b)
    assert float(s) == pytest.approx(0.44 / 0.11) and s.low == pytest.approx(0.40 / 0.12)
    n = timing.ratio(0.004, 0.002)
    assert (float(n), n.low, n.high, n.windows) == (2.0, 2.0, 2.0, ((0.004, None), (0.002, None)))
    import copy

    assert copy.deepcopy(r).windows == r.windows
