"""Skip, then re-run, in one kernel: the learner pass that the browser test shares with JupyterLab.

A learner skips the optional Explore sections, then runs everything again. In one kernel:
run every code cell except the Explore sections (skipping an optional section breaks nothing),
then every code cell a second time, Explore included; no cell may fail, the thread count after
each cell must be what it was the first time, and the setup's settings (its UPPERCASE values)
must come out the same. An Explore section that says to run the sections above first ran just
after them in the second pass; it runs once more at the end.

The browser test (tests/test_browser.py) makes JupyterLab's Run All the second pass, in the same
kernel, so CI executes each notebook once less; where Chromium is missing, tests/
test_rerun_and_skip.py runs the same pass with nbclient. Either way a hook in the kernel
(`post_run_cell`) records the threads and settings after every cell, whoever ran it.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from pathlib import Path

import nbformat

from tests import notebook_sections as ns

CHROMIUM = Path(os.environ.get("FTG_CHROMIUM", "/usr/bin/chromium"))


def browser_missing() -> str | None:
    """Why the browser test cannot run here (then the nbclient pass runs instead), or None."""
    if not CHROMIUM.exists():
        return f"Chromium not found at {CHROMIUM}"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is missing"
    return None


PROBE_MODULE = "ftg_learner_probe"  # where the kernel keeps the records (not the user's globals)
INSTALL_PROBE = f"""
def _ftg_install_probe():
    import sys, types
    ip = get_ipython()
    probe = sys.modules[{PROBE_MODULE!r}] = types.ModuleType({PROBE_MODULE!r})
    probe.records = []

    def record(result):
        torch = sys.modules.get("torch")  # not imported here: a cell before the setup may not
        probe.records.append({{
            "source": result.info.raw_cell if result.info is not None else None,
            "threads": torch.get_num_threads() if torch is not None else None,
            "settings": {{
                k: v for k, v in ip.user_ns.items()
                if k.isupper() and not k.startswith("_") and isinstance(v, (bool, int, float, str))
            }},
        }})

    ip.events.register("post_run_cell", record)
_ftg_install_probe()
del _ftg_install_probe
"""
READ_PROBE = f"print(__import__('json').dumps(__import__('sys').modules[{PROBE_MODULE!r}].records))"

# run(source, what): execute one cell's source in the shared kernel, failing the test with
# `what` on an error; returns what it printed
Run = Callable[[str, str], str]


def first_pass(nb: nbformat.NotebookNode, run: Run, name: str) -> None:
    """Every code cell except the Explore sections', in order."""
    _, secs = ns.sections(nb)
    skipped = {i for s in secs if s.explore for i in s.code}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and i not in skipped:
            run(cell.source, f"{name}, first pass (Explore skipped): cell {i}")


def run_all(nb: nbformat.NotebookNode, run: Run, name: str) -> None:
    """The second pass where no browser runs it: every code cell, in order."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            run(cell.source, f"{name}, second pass: cell {i}")


def explore_above_again(nb: nbformat.NotebookNode, run: Run, name: str) -> None:
    """An Explore section that says to run the sections above first ran right after them in the
    second pass; here it runs a second time (a fresh kernel would repeat the notebook)."""
    _, secs = ns.sections(nb)
    for s in secs:
        if s.explore and s.run_first == ["above"]:
            for i in s.code:
                run(nb.cells[i].source, f"{name}, '{s.title}' run a second time: cell {i}")


def passes(nb: nbformat.NotebookNode, records_json: str) -> tuple[dict, dict, int]:
    """The probe's records split into the two passes, each keyed by cell index, and the index of
    the setup's last cell."""
    setup, secs = ns.sections(nb)
    skipped = {i for s in secs if s.explore for i in s.code}
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    order = [i for i in code if i not in skipped] + code
    sources = {nb.cells[i].source for i in code}
    records = [
        r for r in json.loads(records_json.strip().splitlines()[-1]) if r["source"] in sources
    ]
    ran = [r["source"] for r in records[: len(order)]]
    expected = [nb.cells[i].source for i in order]
    if ran != expected:
        k = next(
            (k for k, (a, b) in enumerate(zip(ran, expected, strict=False)) if a != b),
            min(len(ran), len(expected)),
        )
        seen = repr(ran[k][:60]) if k < len(ran) else "nothing"
        raise AssertionError(
            f"the kernel ran {len(ran)} of the {len(expected)} cells of the two passes; run "
            f"{k} should be cell {order[k] if k < len(order) else '?'}"
            f" ({expected[k][:60] if k < len(expected) else ''!r}), the kernel ran {seen}"
        )
    first_n = len(order) - len(code)
    first = dict(zip(order[:first_n], records[:first_n], strict=True))
    second = dict(zip(code, records[first_n : len(order)], strict=True))
    return first, second, setup[-1] if setup else code[0]


def against_setup(probes: dict, cell: int, setup_cell: int) -> int | str | None:
    """The thread count after `cell`, or "the setup's" where it is what the setup chose."""
    threads = probes[cell]["threads"]
    return "the setup's" if threads == probes[setup_cell]["threads"] else threads


def check_same_state(name: str, first: dict, second: dict, after_setup: int) -> None:
    """No section changes the thread count and keeps it, and the setup gives the same settings
    again. The setup picks its count from the cores free at that moment (devices.share()), which
    a busy machine changes between passes: each pass is read against its own setup's choice.
    From the end of the setup on (the setup may set the notebook's thread count on purpose; the
    cells before it, such as the hosted setup cell, see what the previous pass left)."""
    for i in (i for i in first if i >= after_setup):
        assert against_setup(second, i, after_setup) == against_setup(first, i, after_setup), (
            f"{name}: after cell {i} the second time, "
            f"torch uses {second[i]['threads']} threads (the setup chose "
            f"{second[after_setup]['threads']}), the first time {first[i]['threads']} (the setup "
            f"chose {first[after_setup]['threads']}): a section changed the thread count and "
            "kept it"
        )
    before, again = first[after_setup]["settings"], second[after_setup]["settings"]
    changed = {k: (v, again.get(k)) for k, v in before.items() if again.get(k) != v}
    assert not changed, f"{name}: the setup gives other settings when run again: {changed}"
