"""Budgets that add up, checked without a GPU.

Each notebook's parameters cell and its cells tagged "sizing" (up to their last sizing call) run
in the gpu profile on a faked T4 and a faked H100 (`fake_cuda`), with `timing.benchmark`, which
`Profile.steps` calls, answering a stated step time for what is timed. `Profile.plan` then holds
every timed loop the notebook will run (steps x runs x step time); with the stated one-off costs
and what the notebook costs before any of that (below), it must fit the notebook's budget in
`notebooks/catalog.toml`, and the budgets must add up: 720 s on an H100, 1200 s on a T4 (at most
180 s a notebook). Steps ten times slower must not stretch a notebook either: `Profile.steps`
then picks fewer.

What a notebook costs besides its planned loops, on an H100, is measured: the committed H100 run
at the smoke sizes (kernel and CUDA start, imports, the CPU-side work such as image files,
decoding and workers, which the gpu profile does too) took 9-50 s a notebook; 21 of them cannot
fit the 480 s once planned for the suite, so the H100 total is 720 s (two 10-minute calls)."""

from __future__ import annotations

import ast
import json
import types
from pathlib import Path

import pytest
import torch

from helpers import profiles, timing
from helpers.suite import catalog
from tests import notebook_sections as ns
from tests.test_capabilities import TABLE, fake_cuda  # noqa: F401 - a fixture, used by name

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ENTRIES = {e["file"]: e for e in catalog.load()}
GPUS = {"t4": TABLE[0][1], "h100": TABLE[8][1]}
BUDGET = {"t4": "budget_seconds_t4", "h100": "budget_seconds_h100"}
KERNEL_START = 5.0  # seconds: a kernel's start and the imports, counted once a notebook
SUITE_SECONDS = {"h100": 720, "t4": 1200}  # what each device's budgets add up to at most


def smoke_run_on(gpu: str) -> dict[str, float]:
    """Each notebook's fastest run at the smoke sizes on `gpu` in the catalog's committed
    measurements, less a stall the run found and the runner has since removed (`stall_seconds`):
    what the notebook costs before its planned GPU work."""
    runs: dict[str, float] = {}
    for file, entry in ENTRIES.items():
        for m in entry.get("measured", []):
            if m["profile"] == "smoke" and gpu.upper() in m["run"].upper():
                took = m["seconds"] - m.get("stall_seconds", 0.0)
                runs[file] = min(took, runs.get(file, took))
    return runs


def start_seconds(file: str, gpu: str) -> float:
    """A notebook's cost before its planned loops: its measured smoke run on this GPU; one not
    measured yet, the fastest notebook measured there (a kernel's and CUDA's start is the same for
    all); on a GPU with no measurement, the stated kernel start."""
    measured = smoke_run_on(gpu)
    return measured.get(file, min(measured.values(), default=KERNEL_START))


# Stated seconds per step of what each `profile.steps` times (its `what`), on a T4 and an H100
STEP_SECONDS = {
    # ResNet-18 at width 64, batch 256 of 32x32 images, plain fp32 SGD step
    "training steps per epoch": {"t4": 0.15, "h100": 0.020},
    # notebook 08's sync loop: a 3-layer MLP 2048 wide, batch 512, fp32 SGD: 26 GFLOP a step; a T4
    # sustains ~4.5 TFLOP/s of fp32 matmul (8 peak), an H100 ~35 (50-67 peak, not tensor cores)
    "steps per sync loop": {"t4": 0.006, "h100": 0.0008},
    # notebook 01's big MLP: width 2048, batch 4096, three layers: 0.21 TFLOP a step, fp32
    "big-MLP steps per timed run": {"t4": 0.040, "h100": 0.005},
    # notebook 02's L3 copy: 2**15 images of 28x28 float32 (103 MB) from pinned memory; a T4
    # copies ~12 GB/s host-to-device (PCIe 3 x16), an H100 ~25 GB/s (PCIe 5: ~50 at best)
    "host-to-device copies per timed run": {"t4": 0.009, "h100": 0.004},
    # notebook 06's small CNN (width 32), batch 256 of 32x32: 15 GFLOP a step, some 40 kernels
    "small-CNN steps per pipeline in the epoch-time check": {"t4": 0.005, "h100": 0.0015},
    # notebook 10's MLP (width 1024, 4 blocks), batch 1024, fp32 SGD: 52 GFLOP a step
    "MLP steps per timed run (checkpointing)": {"t4": 0.012, "h100": 0.0015},
    # notebook 19's reference step: d2l's ResNet-18 at width 64, batch 256 of 28x28 one-channel
    # images, fp32 SGD (2.73 GFLOP an image, 0.77x the step above); the committed H100 run took
    # 12.9 ms a step with the data on the device (3.019 s for 234 batches, bench_capstone.md)
    "batches per timed epoch": {"t4": 0.12, "h100": 0.015},
    # notebook 09: a CPU's full-batch step of a 64-wide MLP on 50,600 rows (2 vCPUs; a 16-core box)
    "full-batch regression steps per timed run": {"t4": 0.02, "h100": 0.005},
}
# Stated one-off costs outside the timed loops (compiling, building data, starting workers)
ONE_OFF = {
    # torch.compile of the six-op elementwise chain: Inductor's imports and one Triton kernel
    "01_why_is_it_slow.ipynb": {"t4": 20.0, "h100": 8.0},
    # torch.compile of the ResNet, then again with CUDA graphs (reusing the first's kernels)
    "13_compiler_and_cuda_graphs.ipynb": {"t4": 60.0, "h100": 25.0},
    # the same two compiles in its bars (its 16-bit, channels_last step), and its two accuracy
    # runs' compiles of the fast recipe, which find the bars' kernels in Inductor's caches
    "19_capstone.ipynb": {"t4": 75.0, "h100": 30.0},
}
SIZING_CALLS = ("profile.steps(", "profile.pick(")


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
    return ns["profile"]


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
    fixed = start_seconds(file, gpu) + ONE_OFF.get(file, {}).get(gpu, 0.0)
    for slower in (1.0, 10.0):
        stated_steps.update(gpu=gpu, slower=slower)
        profile = plan(file, gpu)
        assert profile.name == "gpu"
        assert fixed + profile.planned_seconds() <= budget, (file, gpu, slower, profile.plan)


def test_the_budgets_add_up():
    for gpu, total in SUITE_SECONDS.items():
        assert sum(e[BUDGET[gpu]] for e in ENTRIES.values()) <= total, gpu
        # the notebooks' costs before their planned work leave room for the work
        assert sum(start_seconds(f, gpu) for f in ENTRIES) < total, gpu
    assert all(e["budget_seconds_t4"] <= 180 for e in ENTRIES.values())


def test_start_seconds_read_the_committed_smoke_runs(monkeypatch):
    """The measured run counts, less its stall; a notebook not measured gets the fastest one."""
    measured = [{"run": "2026-01-01_NVIDIA-H100", "profile": "smoke", "seconds": 40.0}]
    stalled = [{**measured[0], "seconds": 183.4, "stall_seconds": 149.0}]
    gpu_run = [{**measured[0], "profile": "gpu", "seconds": 1.0}]
    entries = {"a": {"measured": measured}, "b": {"measured": stalled}, "c": {"measured": gpu_run}}
    monkeypatch.setitem(globals(), "ENTRIES", entries)
    assert start_seconds("a", "h100") == 40.0
    assert start_seconds("b", "h100") == pytest.approx(34.4)
    assert start_seconds("c", "h100") == pytest.approx(34.4)  # a gpu-profile run is not a start
    assert start_seconds("a", "t4") == KERNEL_START


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
    profile = profiles.Profile("gpu")
    kw = dict(seconds=1.0, smoke=4, full=100, what="t")
    assert profile.steps(lambda: None, step_seconds=0.1, runs=6, **kw) == 10
    assert profile.planned_seconds() == pytest.approx(10 * 6 * 0.1)  # stated: no calibration steps
    assert profile.steps(lambda: None, step_seconds=2.0, **kw) == 4  # the smoke count: the floor
    assert profile.steps(lambda: None, step_seconds=2.0, least=1, **kw) == 1  # a slow device: fewer
    with pytest.raises(ValueError, match="least must be in 1..smoke"):
        profile.steps(lambda: None, step_seconds=2.0, least=5, **kw)


@pytest.mark.parametrize("file", sorted(ENTRIES))
def test_every_sized_loop_is_in_the_plan(file):
    """A cell that sizes a timed loop by time is tagged "sizing", so the budget test counts it."""
    nb = json.loads((NOTEBOOKS / file).read_text())
    for c in nb["cells"]:
        if c["cell_type"] == "code" and "profile.steps(" in "".join(c["source"]):
            assert "sizing" in c.get("metadata", {}).get("tags", []), (file, c["source"][:3])


# --- every timed loop sized for a GPU -------------------------------------------------------
# The calls that run work under a clock in a notebook's cells (`timing.ratio`, `timing.Ratio` and
# `record.measure` only combine or record what these timed; `profile.steps` sizes, and counts as
# a size)
TIMED_CALLS = ("timing.benchmark", "timing.Timer", "diagnose.DataWaitMeter", "time.perf_counter")
# Notebooks whose timed cells do not yet all take a GPU size, and why (each a task of its own)
NOT_SIZED_YET = {
    "03_dataloader_workers.ipynb": "its worker sweep reads PNG files on the CPU at the smoke "
    "profile's 1024 images; how many a GPU machine's cores need is a measurement of its own",
    "13_compiler_and_cuda_graphs.ipynb": "the CUDA-graph replay times a tiny model on purpose "
    "(launch-bound, batch 32 x 64 features), its sizes literals in the cell, not parameters",
    "18_many_machines_and_sharding.ipynb": "its one clock times a deliberately failing launch "
    "of two CPU processes: a deadline (every rank gone), not a comparison with a size",
}


def _dotted(node: ast.AST) -> str:
    """`a.b.c` for a Name or an Attribute chain; "" for anything else."""
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return node.id if isinstance(node, ast.Name) else ""


def _is_size(call: ast.AST) -> bool:
    """`profile.steps(...)`, or `profile.pick(...)` with a `gpu=` size."""
    if not isinstance(call, ast.Call):
        return False
    name = _dotted(call.func)
    return name == "profile.steps" or (
        name == "profile.pick" and any(k.arg == "gpu" for k in call.keywords)
    )


def _python(source: str) -> str:
    """A cell's code with IPython's line magics and shell lines as `pass` (a `%%` cell: none)."""
    return "" if source.lstrip().startswith("%%") else ns.python_source(source)


def _explore(node: ast.AST) -> bool:
    """An Explore callback (`@one_at_a_time`): the learner's sizes, from its controls."""
    return isinstance(node, ast.FunctionDef) and any(
        "one_at_a_time" in _dotted(d.func if isinstance(d, ast.Call) else d)
        for d in node.decorator_list
    )


def _stored(stmt: ast.stmt) -> set[str]:
    """The names a top-level statement binds."""
    names = {
        n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
        names.add(stmt.name)
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        names |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
    return names


def _reads(stmt: ast.stmt, timed_fns: set[str], timers: set[str]) -> tuple:
    """What a top-level statement reads: the names it loads, whether it calls a size (profile.steps,
    profile.pick with gpu=), whether it times work, whether it reads `time.perf_counter`."""
    nodes = list(ast.walk(stmt))
    loads = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    calls = [_dotted(n.func) for n in nodes if isinstance(n, ast.Call)]
    clocks = {_dotted(w.context_expr) for n in nodes if isinstance(n, ast.With) for w in n.items}
    clocks |= {c.removesuffix(".start") for c in calls}
    perf = "time.perf_counter" in calls
    times = (
        (perf and isinstance(stmt, ast.FunctionDef))  # a function that reads the clock times
        or any(c in TIMED_CALLS[:-1] for c in calls)
        or bool(loads & timed_fns)
        or bool(clocks & timers)
    )
    sizes = any(_is_size(n) for n in nodes)
    return loads, sizes, times, perf


def unsized_timed_cells(cells: list[dict]) -> list[str]:
    """The timed statements of `cells` whose sizes do not come from `profile.steps` or a
    `profile.pick(..., gpu=...)`, each as "cell N: its first line".

    In notebook order, a name is *sized* when the statement that last bound it used a sized name
    or called one of those (flow-sensitive: a name bound again without a size is not sized). A
    statement is *timed* when it makes a timing call (`TIMED_CALLS`) or uses a function that does
    (or starts a `timing.Timer` bound to a name: `with timer:` or `timer.start()`);
    it passes when it is sized. A function that times is sized where it is defined (its body or
    defaults use a size), else at each top-level statement that calls it. Solution cells (the
    learner's exercises) and Explore callbacks (the learner's controls) set their own sizes."""
    sized: set[str] = set()
    timed_fns: set[str] = set()
    timers: set[str] = set()
    missing = []
    for i, cell in enumerate(cells):
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or "solution" in tags:
            continue
        source = _python("".join(cell["source"]))
        cell_loads, cell_sized, clocked, sized_before = set(), False, None, set(sized)
        for stmt in ast.parse(source).body:
            if _explore(stmt):
                continue
            loads, sizes, times, perf = _reads(stmt, timed_fns, timers)
            is_sized = bool(loads & sized) or sizes
            cell_loads |= loads
            cell_sized |= sizes
            if perf and not isinstance(stmt, ast.FunctionDef):
                clocked = clocked or stmt  # a clock read: the cell, between its reads, is timed
            if (
                isinstance(stmt, ast.Assign)
                and isinstance(stmt.value, ast.Call)
                and _dotted(stmt.value.func) == "timing.Timer"
            ):
                timers.update(_stored(stmt))  # a clock: `with timer:` and `timer.start()` time
                continue
            if isinstance(stmt, ast.FunctionDef):
                if times and not is_sized:
                    timed_fns.add(stmt.name)  # its callers size it
                else:
                    timed_fns.discard(stmt.name)
            elif times and not is_sized:
                line = ast.get_source_segment(source, stmt)
                missing.append(f"cell {i}: {line.splitlines()[0]}")
            for name in _stored(stmt):
                (sized.add if is_sized else sized.discard)(name)
        if clocked and not (cell_sized or cell_loads & (sized_before | sized)):
            missing.append(f"cell {i}: {ast.get_source_segment(source, clocked).splitlines()[0]}")
    return missing


@pytest.mark.parametrize("file", sorted(ENTRIES))
def test_every_timed_loop_takes_a_gpu_size(file):
    """Each timed statement's sizes trace back to `profile.steps` or a
    `profile.pick(..., gpu=...)`: on a GPU no comparison times the CPU smoke profile's small
    work (kernel launches, not the lesson). About 0.1 s for all the notebooks."""
    cells = json.loads((NOTEBOOKS / file).read_text())["cells"]
    missing = unsized_timed_cells(cells)
    if file in NOT_SIZED_YET:
        assert missing, f"{file} is sized now: take it out of NOT_SIZED_YET"
    else:
        assert not missing, (file, missing)


def test_an_unsized_timed_cell_is_found():
    """The check above fails on a planted cell that times work of a size without a GPU value,
    and passes the same cell once its size has one (or comes from profile.steps)."""

    def code(src: str, tags=()) -> dict:
        return {"cell_type": "code", "source": src, "metadata": {"tags": list(tags)}}

    params = "profile = profiles.active()\nN = profile.pick(smoke=64, full=4096, what='n')\n"
    timed = "x = torch.randn(N)\nm = timing.benchmark(lambda: x.sum(), repeats=3)\n"
    assert unsized_timed_cells([code(params), code(timed)]) == [
        "cell 1: m = timing.benchmark(lambda: x.sum(), repeats=3)"
    ]
    gpu = params.replace("full=4096", "gpu=4096, full=4096")
    assert unsized_timed_cells([code(gpu), code(timed)]) == []
    steps = params + "R = profile.steps(lambda: None, seconds=1, smoke=3, full=9, what='r')\n"
    in_fn = "def run(k):\n    return timing.benchmark(lambda: x.sum(), repeats=k)\n"
    calls = "x = torch.randn(N)\nrun(3)\n"
    assert unsized_timed_cells([code(steps), code(in_fn), code(calls)]) == ["cell 2: run(3)"]
    assert unsized_timed_cells([code(steps), code(in_fn), code("run(R)\n")]) == []
    # a size bound again without a GPU value is no longer sized; a solution cell is the learner's
    again = "N = 8\n" + timed
    assert unsized_timed_cells([code(gpu), code(again)]) != []
    assert unsized_timed_cells([code(params), code(timed, ["solution"])]) == []
    # planted in a real notebook: work timed at a size without a GPU value (STEPS), then at one
    # that comes from profile.steps (SYNC_STEPS)
    cells = json.loads((NOTEBOOKS / "08_item_hygiene.ipynb").read_text())["cells"]
    assert unsized_timed_cells(cells) == []
    planted = "t = timing.benchmark(lambda: torch.randn({0}, {0}).sum(), repeats=3)\n"
    found = unsized_timed_cells([*cells, code(planted.format("STEPS"))])
    assert found == [f"cell {len(cells)}: {planted.format('STEPS').strip()}"]
    assert unsized_timed_cells([*cells, code(planted.format("SYNC_STEPS"))]) == []
