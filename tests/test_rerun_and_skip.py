"""Learners re-run cells, skip sections and jump to Explore: every notebook must survive all three.

For every notebook, with nbclient (smoke profile):
- skip, then re-run, in one kernel: run every code cell except the Explore sections (skipping an
  optional section breaks nothing), then every code cell a second time, Explore included; no
  cell may fail, the thread count after each cell must be what it was the first time, and the
  setup's settings (its UPPERCASE values) must come out the same;
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


def _against_setup(probes: dict, cell: int, setup_cell: int) -> int | str:
    """The thread count after `cell`, or "the setup's" where it is what the setup chose."""
    threads = probes[cell]["threads"]
    return "the setup's" if threads == probes[setup_cell]["threads"] else threads


def _same_thread_counts(name: str, first: dict, second: dict, after_setup: int) -> None:
    """No section changes the thread count and keeps it. The setup picks its count from the
    cores free at that moment (devices.share()), which a busy machine changes between passes:
    each pass is read against its own setup's choice."""
    for i in (i for i in first if i >= after_setup):
        assert _against_setup(second, i, after_setup) == _against_setup(first, i, after_setup), (
            f"{name}: after cell {i} the second time, "
            f"torch uses {second[i]['threads']} threads (the setup chose "
            f"{second[after_setup]['threads']}), the first time {first[i]['threads']} (the setup "
            f"chose {first[after_setup]['threads']}): a section changed the thread count and "
            "kept it"
        )


def test_thread_counts_are_read_against_each_passes_setup():
    loaded = {2: {"threads": 1}, 5: {"threads": 1}}
    quiet = {2: {"threads": 2}, 5: {"threads": 2}}
    kept = {2: {"threads": 2}, 5: {"threads": 1}}
    assert _against_setup(loaded, 5, 2) == _against_setup(quiet, 5, 2)
    assert _against_setup(kept, 5, 2) != _against_setup(quiet, 5, 2)


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


@pytest.mark.learner
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_skip_explore_rerun_everything_and_explore_first(path):
    t0 = time.perf_counter()
    nb = ns.read(path)
    setup, secs = ns.sections(nb)
    explore = [s for s in secs if s.explore]
    skipped = {i for s in explore for i in s.code}
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]

    client = _client(nb)
    with client.setup_kernel():
        first, second = {}, {}
        for i in code:
            if i in skipped:
                continue
            _run(client, nb, i, f"{path.name}, first pass (Explore skipped)")
            first[i] = _probe(client)
        for i in code:
            _run(client, nb, i, f"{path.name}, second pass")
            second[i] = _probe(client)
        # An Explore section that says to run the sections above first ran just after them in
        # the second pass; here it runs a second time (a fresh kernel would repeat the notebook).
        for s in explore:
            if s.run_first == ["above"]:
                for i in s.code:
                    _run(client, nb, i, f"{path.name}, '{s.title}' run a second time")
    after_setup = setup[-1] if setup else code[0]
    # from the end of the setup on (the setup may set the notebook's thread count on purpose; the
    # cells before it, such as the hosted setup cell, see what the previous pass left)
    _same_thread_counts(path.name, first, second, after_setup)
    changed = {
        k: (v, second[after_setup]["settings"].get(k))
        for k, v in first[after_setup]["settings"].items()
        if second[after_setup]["settings"].get(k) != v
    }
    assert not changed, f"{path.name}: the setup gives other settings when run again: {changed}"

    for s in (s for s in explore if s.run_first != ["above"]):
        nb = ns.read(path)
        client = _client(nb)
        order = [*setup, *ns.prerequisites(secs, s)]
        with client.setup_kernel():
            for i in order:
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
    print(f"\n{path.stem}: skip + re-run + explore-first in {time.perf_counter() - t0:.0f} s")


@pytest.mark.timeout(600)
def test_interrupted_training_cell_runs_again():
    """Stop notebook 06's learning-rate training mid-run (the kernel's interrupt, as the
    toolbar's stop button does), then run the same cell again: it completes, threads restored."""
    path = next(p for p in NOTEBOOKS if p.name.startswith("06_"))
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
