"""Budgets that add up, checked without a GPU.

Each notebook's parameters cell and its cells tagged "sizing" (up to their last sizing call) run
in the gpu profile on a faked T4 and a faked H100 (`fake_cuda`), with `timing.benchmark`, which
`Profile.steps` calls, answering a stated step time for what is timed. `Profile.plan` then holds
every timed loop the notebook will run (steps x runs x step time); with the stated one-off costs
and a kernel start, it must fit the notebook's budget in `notebooks/catalog.toml`, and the
budgets must add up: 480 s on an H100, 1200 s on a T4 (at most 180 s a notebook). Steps ten
times slower must not stretch a notebook either: `Profile.steps` then picks fewer."""

from __future__ import annotations

import ast
import json
import types
from pathlib import Path

import pytest
import torch

from helpers import profiles, timing
from helpers.suite import catalog
from tests.test_capabilities import TABLE, fake_cuda  # noqa: F401 - a fixture, used by name

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ENTRIES = {e["file"]: e for e in catalog.load()}
GPUS = {"t4": TABLE[0][1], "h100": TABLE[8][1]}
BUDGET = {"t4": "budget_seconds_t4", "h100": "budget_seconds_h100"}
KERNEL_START = 5.0  # seconds: a kernel's start and the imports, counted once a notebook

# Stated seconds per step of what each `P.steps` times (its `what`), on a T4 and an H100
STEP_SECONDS = {
    # ResNet-18 at width 64, batch 256 of 32x32 images, plain fp32 SGD step
    "training steps per epoch": {"t4": 0.15, "h100": 0.020},
    # a small model's step with one .item() (notebook 07's sync loop): launches, then a sync
    "steps per sync loop": {"t4": 0.004, "h100": 0.002},
    # notebook 18's reference step: d2l's ResNet-18 at width 64, batch 256 of 28x28 one-channel
    # images, fp32 SGD (2.73 GFLOP an image, 0.77x the step above); the committed H100 run took
    # 12.9 ms a step with the data on the device (3.019 s for 234 batches, bench_capstone.md)
    "batches per timed epoch": {"t4": 0.12, "h100": 0.015},
    # notebook 08: a CPU's full-batch step of a 64-wide MLP on 50,600 rows (2 vCPUs; a 16-core box)
    "full-batch regression steps per timed run": {"t4": 0.02, "h100": 0.005},
}
# Stated one-off costs outside the timed loops (compiling, building data, starting workers)
ONE_OFF = {
    # torch.compile of the ResNet, then again with CUDA graphs (reusing the first's kernels)
    "11b_compiler_and_cuda_graphs.ipynb": {"t4": 60.0, "h100": 25.0},
    # the same two compiles in its bars (its 16-bit, channels_last step), and its two accuracy
    # runs' compiles of the fast recipe, which find the bars' kernels in Inductor's caches
    "18_capstone.ipynb": {"t4": 75.0, "h100": 30.0},
}
SIZING_CALLS = ("P.steps(", "P.pick(")


def sizing_source(cell: dict) -> str:
    """A sizing cell's statements up to its last sizing call (what follows uses the device);
    all of a cell without one (definitions the sizing needs)."""
    src = "".join(cell["source"])
    body = ast.parse(src).body
    last = max(
        (
            i
            for i, s in enumerate(body)
            if any(c in ast.get_source_segment(src, s) for c in SIZING_CALLS)
        ),
        default=len(body) - 1,
    )
    return "\n".join(ast.get_source_segment(src, s) for s in body[: last + 1])


def plan(file: str, gpu: str, slower: float = 1.0) -> profiles.Profile:
    """Run `file`'s parameters and sizing cells in the gpu profile; its Profile, with the plan."""
    nb = json.loads((NOTEBOOKS / file).read_text())
    tags = lambda c: c.get("metadata", {}).get("tags", [])  # noqa: E731
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    first = next(i for i, c in enumerate(cells) if "parameters" in tags(c))
    sizing = [c for c in cells if "sizing" in tags(c)]
    ns: dict = {}
    for i, c in enumerate(cells[: first + 1]):  # the imports, the parameters; not the setup cell
        if "%pip" not in "".join(c["source"]):
            exec(compile("".join(c["source"]), f"{file} cell {i}", "exec"), ns)
    # the faked GPU chose the profile, the sizes and the decisions; what a sizing cell builds
    # before its sizing call lands on the CPU (no step runs: the step time is stated)
    ns["device"] = torch.device("cpu")
    for i, c in enumerate(sizing):
        exec(compile(sizing_source(c), f"{file} sizing {i}", "exec"), ns)
    return ns["P"]


@pytest.fixture
def stated_steps(monkeypatch):
    """`timing.benchmark` answers the stated step time of what is timed (its label)."""
    state = {"gpu": "h100", "slower": 1.0}

    def benchmark(fn, *, label=None, **_):
        return types.SimpleNamespace(median=STEP_SECONDS[label][state["gpu"]] * state["slower"])

    monkeypatch.setattr(timing, "benchmark", benchmark)
    monkeypatch.setenv(profiles.ENV_VAR, "gpu")
    return state


@pytest.mark.parametrize("gpu", sorted(GPUS))
@pytest.mark.parametrize("file", sorted(ENTRIES))
def test_the_planned_work_fits_the_budget(file, gpu, fake_cuda, stated_steps, monkeypatch):  # noqa: F811
    fake_cuda(GPUS[gpu])
    monkeypatch.chdir(NOTEBOOKS)
    budget = ENTRIES[file][BUDGET[gpu]]
    fixed = KERNEL_START + ONE_OFF.get(file, {}).get(gpu, 0.0)
    for slower in (1.0, 10.0):
        stated_steps.update(gpu=gpu, slower=slower)
        P = plan(file, gpu)
        assert P.name == "gpu"
        assert fixed + P.planned_seconds() <= budget, (file, gpu, slower, P.plan)


def test_the_budgets_add_up():
    for gpu, total in (("h100", 480), ("t4", 1200)):
        assert sum(e[BUDGET[gpu]] for e in ENTRIES.values()) <= total, gpu
    assert all(e["budget_seconds_t4"] <= 180 for e in ENTRIES.values())
    assert KERNEL_START * len(ENTRIES) < 480  # the kernel starts alone leave room for the work


def test_a_step_is_built_only_when_it_is_timed(monkeypatch):
    """`make_step` runs at the calibration's first (warm-up) call, once; never in smoke."""
    built, ran = [], []

    def make_step():
        built.append(1)
        return lambda: ran.append(1)

    smoke = profiles.Profile("smoke")
    assert smoke.steps(make_step=make_step, seconds=1, smoke=2, full=9, what="w") == 2
    assert not built and smoke.plan[0]["step_seconds"] is None
    gpu = profiles.Profile("gpu")
    assert gpu.steps(make_step=make_step, seconds=1, smoke=2, full=9, what="w", runs=3) >= 2
    assert built == [1] and len(ran) == 4  # one warm-up and three timed calls of one step
    with pytest.raises(TypeError, match="one function"):
        gpu.steps(lambda: None, make_step=make_step, seconds=1, smoke=2, full=9, what="w")


def test_the_plan_counts_the_runs_the_calibration_and_the_lower_bound():
    P = profiles.Profile("gpu")
    kw = dict(seconds=1.0, smoke=4, full=100, what="t")
    assert P.steps(lambda: None, step_seconds=0.1, runs=6, **kw) == 10
    assert P.planned_seconds() == pytest.approx(10 * 6 * 0.1)  # stated: no calibration steps
    assert P.steps(lambda: None, step_seconds=2.0, **kw) == 4  # the smoke count: the floor
    assert P.steps(lambda: None, step_seconds=2.0, least=1, **kw) == 1  # a slow device: fewer
    with pytest.raises(ValueError, match="least must be in 1..smoke"):
        P.steps(lambda: None, step_seconds=2.0, least=5, **kw)


@pytest.mark.parametrize("file", sorted(ENTRIES))
def test_every_sized_loop_is_in_the_plan(file):
    """A cell that sizes a timed loop by time is tagged "sizing", so the budget test counts it."""
    nb = json.loads((NOTEBOOKS / file).read_text())
    for c in nb["cells"]:
        if c["cell_type"] == "code" and "P.steps(" in "".join(c["source"]):
            assert "sizing" in c.get("metadata", {}).get("tags", []), (file, c["source"][:3])
