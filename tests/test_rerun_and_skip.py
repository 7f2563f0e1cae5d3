"""Learners re-run cells, skip sections and jump to Explore: every notebook must survive all three.

For every notebook, with nbclient (smoke profile):
- skip, then re-run, in one kernel (tests/learner_passes.py): the browser test runs this pass in
  JupyterLab's kernel, its Run All the second pass; only where Chromium is missing does it run
  here;
- explore first, in a fresh kernel: the setup cells, then each Explore section, twice. An Explore
  section that needs more says so in one line of its markdown (`**Run first:** ...`), and the
  sections it names run before it (`the sections above`: it ran right after them in the second
  pass, and runs once more there).
A static check reads each section's code: a section imports every module it uses that the
setup does not (a name imported only in another section is a NameError once that one is skipped).
Interrupting the kernel in a training cell and running the cell again works, and gives the
thread count back (`helpers.devices.cpu_threads` restores it).
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import threading
import time

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from helpers.suite import runner
from tests import learner_passes
from tests import notebook_sections as ns

pytestmark = pytest.mark.slow  # runs notebooks in kernels

NOTEBOOKS = runner.notebook_paths()
IDS = [p.stem.split("_")[0] for p in NOTEBOOKS]
PROBE = (
    "print(__import__('json').dumps({'threads': __import__('torch').get_num_threads(), "
    "'settings': {k: v for k, v in globals().items() if k.isupper() and not k.startswith('_') "
    "and isinstance(v, (bool, int, float, str))}}))"
)


@pytest.fixture(autouse=True)
def _smoke(monkeypatch):
    monkeypatch.setenv("FTG_PROFILE", "smoke")  # the kernels inherit it
    monkeypatch.setenv("PYTHONPATH", str(runner.NOTEBOOKS.parent))


def _client(nb: nbformat.NotebookNode) -> NotebookClient:
    return runner.headless_client(
        nb,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(runner.NOTEBOOKS)}},
    )


def _run(client: NotebookClient, nb, i: int, what: str) -> None:
    try:
        client.execute_cell(nb.cells[i], i)
    except CellExecutionError as e:
        pytest.fail(f"{what}: cell {i} failed: {e.ename}: {e.evalue}\n{nb.cells[i].source[:400]}")


def _probe(client: NotebookClient) -> dict:
    cell = nbformat.v4.new_code_cell(PROBE)
    client.execute_cell(cell, 0, store_history=False)
    text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    return json.loads(text.strip().splitlines()[-1])


def test_thread_counts_are_read_against_each_passes_setup():
    loaded = {2: {"threads": 1}, 5: {"threads": 1}}
    quiet = {2: {"threads": 2}, 5: {"threads": 2}}
    kept = {2: {"threads": 2}, 5: {"threads": 1}}
    assert learner_passes.against_setup(loaded, 5, 2) == learner_passes.against_setup(quiet, 5, 2)
    assert learner_passes.against_setup(kept, 5, 2) != learner_passes.against_setup(quiet, 5, 2)


def test_the_two_passes_are_read_from_the_probe_and_a_kept_thread_count_fails():
    cell, md = nbformat.v4.new_code_cell, nbformat.v4.new_markdown_cell
    nb = nbformat.v4.new_notebook(
        cells=[
            cell("SIZE = 8"),
            md("## 1 · Work"),
            cell("work()"),
            md("## Explore"),
            cell("explore()"),
        ]
    )

    def record(source, threads, size=8):
        return {"source": source, "threads": threads, "settings": {"SIZE": size}}

    runs = [("SIZE = 8", 2), ("work()", 2), ("SIZE = 8", 2), ("work()", 2), ("explore()", 1)]
    records = [record("the probe itself", 2), *(record(src, t) for src, t in runs)]
    first, second, after_setup = learner_passes.passes(nb, json.dumps(records))
    assert (sorted(first), sorted(second), after_setup) == ([0, 2], [0, 2, 4], 0)
    learner_passes.check_same_state("nb", first, second, after_setup)
    kept = {**second, 2: record("work()", 1)}
    with pytest.raises(AssertionError, match="a section changed the thread count and kept it"):
        learner_passes.check_same_state("nb", first, kept, after_setup)
    other = {**second, 0: record("SIZE = 8", 2, size=16)}
    with pytest.raises(AssertionError, match="other settings when run again"):
        learner_passes.check_same_state("nb", first, other, after_setup)
    with pytest.raises(
        AssertionError, match="ran 4 of the 5 cells of the two passes; run 4 should be cell 4"
    ):
        learner_passes.passes(nb, json.dumps(records[:-1]))


def test_run_first_reads_ranges_as_a_learner_does():
    # "sections 2 to 4" once read as sections 2 and 4, so the re-run skipped section 3
    assert ns._labels("sections 1 to 4 (the script)") == ["1", "2", "3", "4"]
    assert ns._labels("sections 2-3, then (a)") == ["2", "3", "(a)"]
    assert ns._labels("section 2 and section 5") == ["2", "5"]


KERNEL_NAMES = set(dir(builtins)) | {"display", "get_ipython"}


def _unbound_before_explore(nb, setup: list[int], secs: list, s) -> list[str]:
    """Names an Explore section (or what it says to run first) reads that neither the setup nor
    those sections bind: run as its "Run first" line says, it would raise NameError (inside an
    `interact()` callback the error is only shown under the controls, never raised)."""
    cells = [*setup, *ns.prerequisites(secs, s), *s.code]
    bound = set().union(*(ns.all_bound_names(nb.cells[i].source) for i in cells))
    used = set().union(*(ns.used_names(nb.cells[i].source) for i in cells))
    return sorted(used - bound - KERNEL_NAMES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_an_explore_run_as_it_says_has_every_name_it_reads(path):
    nb = ns.read(path)
    setup, secs = ns.sections(nb)
    problems = [
        f"'{s.title}' (run first: {s.run_first or 'nothing'}) reads {missing}"
        for s in secs
        if s.explore and s.run_first != ["above"]
        for missing in [_unbound_before_explore(nb, setup, secs, s)]
        if missing
    ]
    assert not problems, f"{path.name}: " + "; ".join(problems)


def test_an_explore_that_skips_a_section_it_needs_is_found():
    cell = nbformat.v4.new_markdown_cell
    code = nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(
        cells=[
            code("import math"),
            cell("## 1 · Data"),
            code("data = [1, 2]"),
            cell("## 2 · Model"),
            code("def model(x):\n    return math.sqrt(x)"),
            cell("## Explore\n\n**Run first:** section 2."),
            code("print([model(x) for x in data])"),
        ]
    )
    setup, secs = ns.sections(nb)
    assert _unbound_before_explore(nb, setup, secs, secs[-1]) == ["data"]
    nb.cells[5].source = "## Explore\n\n**Run first:** sections 1 to 2."
    setup, secs = ns.sections(nb)
    assert _unbound_before_explore(nb, setup, secs, secs[-1]) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_each_section_imports_what_it_uses(path):
    nb = ns.read(path)
    setup, secs = ns.sections(nb)
    assert secs, f"{path.name}: no sections found"
    from_setup = set().union(*(ns.imported_names(nb.cells[i].source) for i in setup))
    imports = {
        s.title: set().union(*(ns.imported_names(nb.cells[i].source) for i in s.code)) for s in secs
    }
    problems = []
    for s in secs:
        used = set().union(*(ns.used_names(nb.cells[i].source) for i in s.code))
        for name in sorted(used - imports[s.title] - from_setup):
            elsewhere = [t for t, names in imports.items() if name in names and t != s.title]
            if elsewhere:
                problems.append(f"'{s.title}' uses {name} but only '{elsewhere[0]}' imports it")
    assert not problems, f"{path.name}: " + "; ".join(problems)


def _rebound_under_explore(cells: list[str]) -> list[str]:
    """Names an Explore callback reads that a later cell binds anew: after Run All, moving a
    control would compute with the later cell's value (a list where it expects a dict...)."""
    found = []
    for i, source in enumerate(cells):
        for fn, reads in ns.explore_callbacks(source).items():
            found += [
                f"{fn} (cell {i}) reads {name}, which cell {j} binds again"
                for j in range(i + 1, len(cells))
                for name in sorted(ns.bound_names(cells[j]) & reads)
            ]
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_later_cell_rebinds_what_an_explore_callback_reads(path):
    nb = ns.read(path)
    problems = _rebound_under_explore([c.source if c.cell_type == "code" else "" for c in nb.cells])
    assert not problems, f"{path.name}: " + "; ".join(problems)


def test_a_rebound_explore_name_is_found():
    explore = (
        "import matplotlib.pyplot as plt\n@one_at_a_time\n"
        "def explore(x=1):\n    plt.bar([0], [timed[x]])\n"
        "widgets.interact(explore, x=widgets.Dropdown(options=[1, 2]))"
    )
    later = ["import matplotlib.pyplot as plt\nok = [r for r in rows]", "timed = [r for r in rows]"]
    assert _rebound_under_explore([explore, later[0]]) == []
    assert _rebound_under_explore([explore, *later]) == [
        "explore (cell 0) reads timed, which cell 2 binds again"
    ]


def _runs_in(client: NotebookClient) -> learner_passes.Run:
    """`run(source, what)` in the client's kernel, as the browser test's second client does."""

    def run(source: str, what: str) -> str:
        cell = nbformat.v4.new_code_cell(source)
        try:
            client.execute_cell(cell, 0)
        except CellExecutionError as e:
            pytest.fail(f"{what} failed: {e.ename}: {e.evalue}\n{source[:400]}")
        return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")

    return run


@pytest.mark.learner
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_skip_explore_then_rerun_everything(path):
    """Only where the browser test cannot run: there JupyterLab's Run All is the second pass."""
    if (why := learner_passes.browser_missing()) is None:
        pytest.skip("the browser test runs this pass in JupyterLab's kernel")
    nb = ns.read(path)
    client = _client(ns.read(path))  # its own copy: execute_cell(cell, 0) stores into cell 0
    with client.setup_kernel():
        run = _runs_in(client)
        run(learner_passes.INSTALL_PROBE, "the probe of the thread counts and settings")
        learner_passes.first_pass(nb, run, path.name)
        learner_passes.run_all(nb, run, path.name)
        learner_passes.explore_above_again(nb, run, path.name)
        records = run(learner_passes.READ_PROBE, "reading the probe")
    first, second, after_setup = learner_passes.passes(nb, records)
    learner_passes.check_same_state(path.name, first, second, after_setup)
    print(f"\n{path.stem}: skip + re-run with nbclient ({why})")


@pytest.mark.learner
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_explore_first_runs_as_it_says(path):
    """Each Explore section that does not need the sections above, in a fresh kernel: the setup,
    what its "Run first" line names, then the section twice."""
    t0 = time.perf_counter()
    setup, secs = ns.sections(ns.read(path))
    alone = [s for s in secs if s.explore and s.run_first != ["above"]]
    if not alone:
        pytest.skip(f"{path.name}: every Explore section runs after the sections above")
    for s in alone:
        nb = ns.read(path)
        client = _client(nb)
        with client.setup_kernel():
            for i in [*setup, *ns.prerequisites(secs, s)]:
                _run(client, nb, i, f"{path.name}, before '{s.title}'")
            for attempt in ("first", "second"):
                for i in s.code:
                    _run(
                        client,
                        nb,
                        i,
                        f"{path.name}, '{s.title}' right after "
                        f"{'the setup' if not s.run_first else 'what it says to run first'} "
                        f"({attempt} run)",
                    )
    print(f"\n{path.stem}: explore-first in {time.perf_counter() - t0:.0f} s")


@pytest.mark.timeout(600)
def test_interrupted_training_cell_runs_again():
    """Stop notebook 07's learning-rate training mid-run (the kernel's interrupt, as the
    toolbar's stop button does), then run the same cell again: it completes, threads restored."""
    path = next(p for p in NOTEBOOKS if p.name.startswith("07_"))
    nb = ns.read(path)
    setup, secs = ns.sections(nb)
    train = next(
        i
        for s in secs
        for i in s.code
        if "training.train(" in nb.cells[i].source and "learning-rate runs" in nb.cells[i].source
    )
    client = _client(nb)
    with client.setup_kernel():
        for i in setup:
            _run(client, nb, i, "setup")
        threads_before = _probe(client)["threads"]
        # Long enough on any machine that the interrupt lands inside the training loop.
        client.execute_cell(
            nbformat.v4.new_code_cell("LR_EPOCHS_SET, LR_EPOCHS = LR_EPOCHS, 100_000"), 0
        )

        def interrupt_once_training() -> None:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                if nb.cells[train].outputs:  # the progress bar is up: the loop has begun
                    time.sleep(1.0)  # inside the loop now
                    # what the stop button does: SIGINT to the kernel (km's own call is a
                    # coroutine of the loop this thread is not in)
                    os.kill(client.km.provisioner.process.pid, signal.SIGINT)
                    return
                time.sleep(0.2)

        watcher = threading.Thread(target=interrupt_once_training, daemon=True)
        watcher.start()
        t0 = time.perf_counter()
        with pytest.raises(CellExecutionError) as err:
            client.execute_cell(nb.cells[train], train)
        watcher.join(timeout=5)
        assert err.value.ename == "KeyboardInterrupt", (
            f"expected an interrupt, got {err.value.ename}"
        )
        print(f"\ninterrupted after {time.perf_counter() - t0:.1f} s")
        assert _probe(client)["threads"] == threads_before, (
            "the interrupted cell kept its thread count"
        )
        client.execute_cell(nbformat.v4.new_code_cell("LR_EPOCHS = LR_EPOCHS_SET"), 0)
        nb.cells[train].outputs = []
        _run(client, nb, train, "the training cell run again after the interrupt")
        assert _probe(client)["threads"] == threads_before
