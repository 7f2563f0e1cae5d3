"""helpers.diagnose: `DataWaitMeter` splits a step into waiting for data and the step,
`StepWindow` profiles the steps it is told to and says how busy they were, and `bottleneck`,
the suite's one classifier, names what bounds a loop from its shares of the step."""

import ast
import json
import time
from pathlib import Path

import nbformat
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import diagnose, models
from helpers.diagnose import DataWaitMeter
from tests import notebook_sections as ns


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


def test_step_window_profiles_its_steps_and_a_convolution_loop_is_busy():
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


def test_a_loop_whose_time_is_in_the_step_is_not_input_bound():
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

    for name in ("INPUT_WAIT_SHARE", "COPY_WAIT_SHARE", "SYNC_STALL_SHARE", "OVERHEAD_SHARE"):
        assert getattr(rules, name) is getattr(diagnose, name)
    schema = json.loads(rules.SCHEMA_FILE.read_text())["$defs"]
    assert schema["verdict"]["properties"]["kind"]["enum"] == list(diagnose.VERDICTS)
    finding_kinds = set(schema["finding"]["properties"]["kind"]["enum"])
    assert set(diagnose.VERDICTS) - {"inconclusive"} <= finding_kinds == set(rules.NOTEBOOKS)
    assert "compute-bound" not in finding_kinds | set(diagnose.VERDICTS)


# --- the one classifier: every verdict, from shares just either side of each threshold ----------

EPS = 1e-6
BUSY, NEAR = diagnose.DEVICE_BUSY, diagnose.NEAR_CEILING


def verdict(**shares) -> str:
    return diagnose.bottleneck(**shares).kind


@pytest.mark.parametrize("line", diagnose.HOST_WAITS, ids=[t.kind for t in diagnose.HOST_WAITS])
def test_a_host_wait_names_the_loop_from_its_threshold_on(line):
    base = {"data_wait": 0.0, "busy": BUSY + EPS}  # below: a busy device, the data ready
    assert verdict(**{**base, line.share: line.at + EPS}) == line.kind
    assert verdict(**{**base, line.share: line.at}) == line.kind  # "at least" the threshold
    assert verdict(**{**base, line.share: line.at - EPS}) == "device-bound"
    v = diagnose.bottleneck(**{line.share: line.at})  # alone, nothing else measured
    assert v.kind == line.kind and f"{line.at:.0%}" in v.rule and v.shares[line.share] == line.at


def test_a_busy_device_is_device_bound_and_an_idle_one_overhead_bound():
    assert verdict(data_wait=0.0, busy=BUSY + EPS) == "device-bound"
    assert verdict(data_wait=0.0, busy=BUSY) == "device-bound"
    assert verdict(data_wait=0.0, busy=BUSY - EPS) == "overhead-bound"  # the host does not feed it
    assert verdict(busy=1.0) == "device-bound"  # a busy device: the data wait cannot change it


def test_a_busy_device_without_its_rate_is_device_bound_never_compute_bound():
    v = diagnose.bottleneck(data_wait=0.0, busy=1.0)
    assert v.kind == "device-bound" and "compute" not in v.kind
    assert "compute-bound" not in diagnose.VERDICTS  # busy time counts memory-bound kernels too
    assert f"{BUSY:.0%}" in v.rule and "not measured" in v.rule


def test_the_rate_says_near_or_below_the_ceiling():
    busy = {"data_wait": 0.0, "busy": BUSY + EPS}
    assert verdict(**busy, rate=NEAR + EPS) == "device-bound, near its ceiling"
    assert verdict(**busy, rate=NEAR) == "device-bound, near its ceiling"
    assert verdict(**busy, rate=NEAR - EPS) == "device-bound, below its ceiling"
    assert verdict(**busy, rate=1.3) == "device-bound, near its ceiling"  # read above the roof
    assert verdict(data_wait=0.0, busy=BUSY - EPS, rate=NEAR + EPS) == "overhead-bound"


def test_inconclusive_where_what_decides_was_not_measured():
    assert verdict() == "inconclusive"
    below = {t.share: t.at - EPS for t in diagnose.HOST_WAITS}
    assert verdict(**below) == "inconclusive"  # no wait, and the device's share unknown
    assert verdict(busy=BUSY - EPS) == "inconclusive"  # an idle device: input or the host?
    assert verdict(**below, busy=BUSY - EPS) == "overhead-bound"


def test_the_largest_wait_over_its_line_names_the_loop_a_tie_the_first():
    data, overhead = diagnose.HOST_WAITS[0], diagnose.HOST_WAITS[-1]
    assert verdict(data_wait=overhead.at + 0.1, overhead=overhead.at) == data.kind
    assert verdict(data_wait=overhead.at, overhead=overhead.at + 0.1) == overhead.kind
    tie = {t.share: 0.5 for t in diagnose.HOST_WAITS}
    assert verdict(**tie) == diagnose.HOST_WAITS[0].kind


def test_every_verdict_is_reachable_and_every_threshold_has_its_source():
    reached = {
        verdict(**shares)
        for shares in (
            *({t.share: t.at} for t in diagnose.HOST_WAITS),
            {"data_wait": 0.0, "busy": BUSY},
            {"data_wait": 0.0, "busy": BUSY - EPS},
            {"busy": BUSY, "rate": NEAR},
            {"busy": BUSY, "rate": NEAR - EPS},
            {},
        )
    }
    assert reached == set(diagnose.VERDICTS)
    for t in diagnose.THRESHOLDS:
        assert t.source and 0 < t.at < 1 and t.kind in diagnose.VERDICTS
        assert f"{t.words} >= {t.at:.0%}" in diagnose.RULE or t in (diagnose.BUSY, diagnose.CEILING)


def test_busy_fraction_is_busy_over_wall_at_most_one():
    assert diagnose.busy_fraction(0.3, 1.2) == pytest.approx(0.25)
    assert diagnose.busy_fraction(1.5, 1.0) == 1.0


def test_step_window_reads_the_data_wait_of_a_dataloader():
    loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8)
    w = diagnose.StepWindow(device="cpu", warmup=1, steps=3)
    for k, _ in enumerate(loader, 1):
        w(k)
    w.finish()
    assert w.steps_done == 3 and 0 < w.wait_fraction <= 1  # DataLoader's own profiler labels
    assert diagnose.loader_wait_seconds(w.prof) > 0
    plain = diagnose.StepWindow(device="cpu", warmup=1, steps=2)
    _loop(plain, plain.stop_after)
    assert plain.finish().wait_fraction is None  # batches not from a DataLoader: not measured


# --- one classifier: the notebooks call it and keep no thresholds of their own -------------------

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
HELPERS = Path(__file__).resolve().parents[1] / "helpers"
THRESHOLD_NAMES = {
    name
    for name, value in vars(diagnose).items()
    if name.isupper() and isinstance(value, float) and value in {t.at for t in diagnose.THRESHOLDS}
}


def _code(notebook: str) -> ast.Module:
    nb = nbformat.read(NOTEBOOKS / notebook, as_version=4)
    return ast.parse(
        "\n\n".join(ns.python_source(c.source) for c in nb.cells if c.cell_type == "code")
    )


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


@pytest.mark.parametrize("notebook", ["04_profiling.ipynb", "19_capstone.ipynb"])
def test_profiling_and_capstone_call_the_classifier_and_hold_no_thresholds(notebook):
    tree = _code(notebook)
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "bottleneck"
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "diagnose"
    ]
    assert calls, f"{notebook} names no loop by diagnose.bottleneck"
    assert not THRESHOLD_NAMES & _names(tree), "a threshold copied into the notebook"
    for n in ast.walk(tree):  # no share compared with a number of the notebook's own
        if isinstance(n, ast.Compare) and not all(isinstance(o, ast.Is | ast.IsNot) for o in n.ops):
            words = {w for name in _names(n) for w in name.lower().split("_")}
            assert not words & {"busy", "wait"}, f"{notebook}: {ast.unparse(n)}"


def test_one_loop_classifier_in_helpers_and_notebooks():
    """`grep "def diagnose\\|bound_by\\|def regime"`: none left; the one classifier is
    diagnose.bottleneck (notebook 01's `op_regime` names single operations on a roofline)."""
    found = []
    for path in [*HELPERS.rglob("*.py"), *NOTEBOOKS.glob("*.ipynb")]:
        text = path.read_text()
        found += [
            f"{path.name}: {w}" for w in ("def diagnose", "bound_by", "def regime") if w in text
        ]
    assert found == []
    defs = [
        n.name
        for path in HELPERS.rglob("*.py")
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.FunctionDef) and n.name == "bottleneck"
    ]
    assert defs == ["bottleneck"]


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
