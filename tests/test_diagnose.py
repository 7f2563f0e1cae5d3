"""helpers.diagnose: `DataWaitMeter` splits a step into waiting for data and the step, and
`StepWindow` profiles the steps it is told to and says how busy they were."""

import time

import pytest
import torch

from helpers import diagnose, models
from helpers.diagnose import DataWaitMeter


def _loop(window, steps):
    torch.manual_seed(0)
    net = models.resnet18(width=4, in_channels=1)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for k in range(1, steps + 1):
        X, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(X), y).backward()
        opt.step()
        window(k)


def test_step_window_profiles_its_steps_and_a_compute_bound_loop_is_busy():
    w = diagnose.StepWindow(device="cpu", warmup=1, steps=2)
    _loop(w, w.stop_after + 2)  # the loop runs on past the window: those steps are not profiled
    w.finish()
    assert w.steps_done == 2 and w.count("aten::convolution") > 0 and w.count("no such op") == 0
    assert w.count("ProfilerStep") == 2  # the schedule recorded the window's steps, no more
    assert 0.5 < w.busy_fraction <= 1.0  # convolutions, not Python, fill a ResNet step


@pytest.mark.slow
def test_step_window_closed_early_and_never_reached():
    early = diagnose.StepWindow(device="cpu", warmup=1, steps=5)
    _loop(early, 3)
    assert early.finish().steps_done == 2 and early.busy_fraction is not None
    never = diagnose.StepWindow(device="cpu", warmup=4, steps=2)
    _loop(never, 2)
    assert (
        never.finish().steps_done == 0 and never.busy_fraction is None and never.count("aten") == 0
    )


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
    assert "the time is in the step" in meter.diagnosis()


def test_the_steps_as_one_timed_window():
    """What a claim judged on a meter reads: the mean step, and the whole window's seconds."""
    meter = DataWaitMeter(range(4), device="cpu")
    for _ in meter:
        time.sleep(0.01)
    t, s = meter.timing(skip=1), meter.summary(skip=1)
    assert t.median == s["step_s"] and t.window == pytest.approx(3 * s["step_s"])
    assert t.device == "cpu" and t.window >= 0.03
    with pytest.raises(ValueError, match="no step was timed after the first 4: run more steps"):
        meter.timing(skip=4)


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


@pytest.mark.parametrize(
    "wait", [0.0, diagnose.INPUT_WAIT_SHARE - 1e-9, diagnose.INPUT_WAIT_SHARE, 0.5, 1.0]
)
def test_wait_verdict_either_side_of_its_threshold(wait):
    kind, sentence = diagnose.wait_verdict(wait)
    expected = "input-bound" if wait >= diagnose.INPUT_WAIT_SHARE else "not input-bound"
    assert kind == expected and f"{100 * wait:.0f} %" in sentence
    assert f"input-bound from {diagnose.INPUT_WAIT_SHARE:.0%}" in sentence  # the rule it used


def test_the_doctor_and_the_notebooks_share_one_rule_set():
    from helpers.doctor import rules

    assert rules.INPUT_WAIT_SHARE is diagnose.INPUT_WAIT_SHARE
    assert rules.LOW_BUSY is diagnose.DEVICE_BUSY


def test_profiler_activities_ask_for_the_gpu_kernels_where_torch_profiler_records_them():
    from torch.profiler import ProfilerActivity as A

    assert diagnose.profiler_activities("cpu") == [A.CPU]
    assert diagnose.profiler_activities("cuda") == [A.CPU, A.CUDA]
    assert diagnose.profiler_activities("xpu") == [A.CPU, A.XPU]
    assert diagnose.profiler_activities("mps") == [A.CPU]  # no MPS activity exists


def test_busy_counts_kernels_overlapping_on_two_streams_once_and_averages_the_gpus():
    """The one busy formula: covered time per GPU, not the sum of kernel spans."""
    from types import SimpleNamespace as NS

    cuda = torch.autograd.DeviceType.CUDA

    def kernel(gpu, start, end, label=False):
        span = NS(start=start, end=end)
        return NS(device_type=cuda, device_index=gpu, time_range=span, is_user_annotation=label)

    prof = NS(
        events=lambda: [
            kernel(0, 0, 600_000),
            kernel(0, 400_000, 1_000_000),  # another stream, overlapping the first by 0.2 s
            kernel(0, 0, 5_000_000, label=True),  # a record_function label: not work
            kernel(1, 0, 200_000),
        ]
    )
    assert diagnose.busy_seconds(prof, "cuda") == pytest.approx((1.0 + 0.2) / 2)
