"""Under load, slower, never stalled: every notebook run alone and then beside one busy process
(`make test-load`, not `make test`: it runs every notebook twice on a machine it needs quiet).

Beside one busy program a notebook may lose that program's core, no more: on the 2-core machine
that is at most 2x for work that used both cores, and the limit below leaves room for noise.
Many more threads than free cores is what turns such a loss into a collapse (a thread waiting
at every barrier for a partner that is not running); the suite's thread rule
(`devices.share`) keeps the notebooks out of it. Cells that oversubscribe *on purpose*, to show
that collapse, carry the cell tag `oversubscribes` and are left out of the comparison.
The run alone also keeps the notebook's smoke budget, as `make notebooks` checks it.

The run beside a busy process is made only for a notebook whose run alone kept more than one
core busy for part of it (its processes' CPU seconds past its wall seconds, measured): threads,
DataLoader workers, ranks. A notebook that works on one core keeps that core beside one busy
program on a machine of two or more, so its loaded run would show about 1x and prove nothing
(measured on the 2-core machine: 0.88-1.23x for all of them).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from helpers.processes import usable_cores
from helpers.suite import catalog, runner
from tests.nbval_budget import CATALOG, allowed_seconds

pytestmark = pytest.mark.load

MOST_SLOWDOWN = 2.5  # beside one busy process, at most this many times the time alone
SLACK_SECONDS = 1.0  # a notebook of a few seconds is judged on more than its noise
# CPU seconds past wall seconds that show more than one core busy (one core's noise: about 1 s
# either way on the 2-core machine for notebooks that stay on one thread)
MANY_CORES_SECONDS = 0.5
ON_PURPOSE = "oversubscribes"
NOTEBOOKS = runner.notebook_paths()


@contextlib.contextmanager
def one_busy_process() -> Iterator[None]:
    """Another program keeping one core busy for as long as the block runs."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        busy.kill()
        busy.wait()


def _stamp(cell, key: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(cell.metadata["execution"][key].replace("Z", "+00:00"))


def cell_seconds(executed: Path) -> list[tuple[set[str], float]]:
    """Each executed code cell's tags and seconds, from the timings nbclient records."""
    nb = nbformat.read(executed, as_version=4)
    return [
        (
            set(c.metadata.get("tags", [])),
            (_stamp(c, "shell.execute_reply") - _stamp(c, "iopub.execute_input")).total_seconds(),
        )
        for c in nb.cells
        if c.cell_type == "code" and "execution" in c.metadata
    ]


def counted_seconds(nb: Path, out_dir: Path) -> tuple[float, float, float]:
    """Run the notebook in a fresh kernel: the seconds of its cells, those tagged as
    oversubscribing on purpose left out; the whole run's seconds (kernel start included); and
    the CPU seconds of the kernel and every process it started and waited for (the kernel is
    this process's child: its usage, with its children's, is counted when it is reaped)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    outcome = runner.execute(nb, out_dir, timeout=300)  # a cell past 5 min is stalled
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert outcome["status"] == "ok", f"{nb.name}: {outcome['error']}"
    cells = sum(s for tags, s in cell_seconds(out_dir / nb.name) if ON_PURPOSE not in tags)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cells, outcome["seconds"], cpu


def within_budget(nb: Path, took: float) -> None:
    """The run alone keeps the notebook's smoke budget, as `make notebooks` checks it (the same
    catalog entry and load rule): CI runs every notebook alone here instead of a seventh time."""
    (entry,) = [e for e in catalog.load(CATALOG) if e["file"] == nb.name]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    allowed = allowed_seconds(entry["budget_seconds"], load, usable_cores())
    assert took <= allowed, (
        f"{nb.name} took {took:.0f} s alone, over its smoke budget ({allowed:.0f} s allowed)"
    )


def test_cell_seconds_reads_nbclient_timings(tmp_path):
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("import time; time.sleep(0.3)"),
            nbformat.v4.new_code_cell("1", metadata={"tags": [ON_PURPOSE]}),
        ]
    )
    path = tmp_path / "timed.ipynb"
    nbformat.write(nb, path)
    runner.execute(path, tmp_path / "out", timeout=60)
    (tags0, s0), (tags1, _) = cell_seconds(tmp_path / "out" / "timed.ipynb")
    assert 0.25 < s0 < 5 and tags0 == set() and tags1 == {ON_PURPOSE}


def test_cpu_seconds_count_the_processes_a_notebook_starts(tmp_path):
    """Two processes each busy for 2 CPU seconds, started and waited for by the kernel: their
    CPU seconds are counted (the kernel alone uses less than 4), which is how a notebook on
    more than one core is told apart."""
    spin = "import time; t = time.process_time(); exec('while time.process_time() - t < 2: pass')"
    start = f"subprocess.Popen([sys.executable, '-c', {spin!r}])"
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                f"import subprocess, sys\nprocs = [{start}, {start}]\n"
                "assert all(p.wait() == 0 for p in procs)"
            )
        ]
    )
    path = tmp_path / "two.ipynb"
    nbformat.write(nb, path)
    _, wall, cpu = counted_seconds(path, tmp_path / "out")
    assert cpu >= 4.0, (cpu, wall)


# Where the runs alone leave their results (`make test-load` sets it): the capstone's ratio
# benchmark (benchmarks/test_capstone_ratio.py) reads its waterfall from there instead of running
# the capstone once more; its run alone is the quiet, single run that benchmark needs.
ALONE_RESULTS = "FTG_ALONE_RESULTS"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_beside_one_busy_process_slower_never_stalled(nb, tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        if os.environ.get(ALONE_RESULTS):
            # the kernel inherits it, and resolves a relative path from its own folder
            m.setenv("FTG_RESULTS_DIR", str(Path(os.environ[ALONE_RESULTS]).resolve()))
        alone, alone_wall, cpu = counted_seconds(nb, tmp_path / "alone")
    within_budget(nb, alone_wall)
    if cpu - alone_wall < MANY_CORES_SECONDS:
        print(
            f"\n{nb.stem}: {alone:.1f} s alone on one core ({cpu:.1f} CPU s in "
            f"{alone_wall:.1f} s): no run beside a busy process"
        )
        return
    with one_busy_process():
        loaded, _, _ = counted_seconds(nb, tmp_path / "loaded")
    print(
        f"\n{nb.stem}: {alone:.1f} s alone, {loaded:.1f} s beside one busy process "
        f"({loaded / alone:.2f}x)"
    )
    assert loaded <= MOST_SLOWDOWN * alone + SLACK_SECONDS, (
        f"{nb.name}: {loaded:.1f} s beside one busy process, {alone:.1f} s alone"
    )
