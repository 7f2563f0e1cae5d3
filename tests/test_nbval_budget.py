"""The notebook budget plugin really fails: over budget, missing from the catalog, or a skip."""

import os
import textwrap

import nbformat
import pytest

pytestmark = pytest.mark.slow  # runs nbval on notebooks in a child pytest

pytest_plugins = ["pytester"]


def _setup(pytester, seconds, catalog_entry):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"import time\ntime.sleep({seconds})")]
    nbformat.write(nb, pytester.path / "99_tiny.ipynb")
    (pytester.path / "catalog.toml").write_text(textwrap.dedent(catalog_entry))
    import os

    os.environ["FTG_CATALOG"] = str(pytester.path / "catalog.toml")  # restored by the fixture


def _run(pytester):
    return pytester.runpytest_subprocess(
        "--nbval-lax",
        "--nbval-current-env",
        "-p",
        "tests.nbval_budget",
        "99_tiny.ipynb",
        "-p",
        "no:cacheprovider",
    )


ENTRY = """
[[notebook]]
file = "99_tiny.ipynb"
title = "tiny"
needs = "cpu"
smoke_seconds = 1
budget_seconds = {budget}
{extra}
"""


@pytest.fixture(autouse=True)
def _importable(pytester, monkeypatch):
    from pathlib import Path

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    monkeypatch.setenv("FTG_BUDGET_LOAD", "0")  # the tests below fix the load they mean
    monkeypatch.setenv("FTG_CATALOG", "")  # registers it for restoring; _setup sets the value


def test_within_budget_passes(pytester):
    _setup(pytester, 0, ENTRY.format(budget=60, extra=""))
    _run(pytester).assert_outcomes(passed=2)


@pytest.mark.parametrize("load", ["0", "6"], ids=["idle machine", "load 6: budget stretched"])
def test_over_budget_fails(pytester, monkeypatch, load):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = str(float(load) * cores / 2)  # the same share of other programs on any machine
    monkeypatch.setenv("FTG_BUDGET_LOAD", load)  # the machine's real load must not decide it
    seconds = 1.5 if load == "0.0" else 5  # over 1 s; over 1 s x (1 + (6 - 2) / 2) = 3 s
    _setup(pytester, seconds, ENTRY.format(budget=1, extra=""))
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*over its smoke budget of 1 s*"])


def test_missing_from_catalog_fails(pytester):
    _setup(pytester, 0, ENTRY.format(budget=60, extra="").replace("99_tiny", "98_other"))
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*missing from notebooks/catalog.toml*"])


def test_skip_needs_and_shows_its_reason(pytester):
    _setup(pytester, 0, ENTRY.format(budget=60, extra='skip_reason = "needs 8 GPUs"'))
    result = pytester.runpytest_subprocess(
        "--nbval-lax", "--nbval-current-env", "-p", "tests.nbval_budget", "99_tiny.ipynb", "-rs"
    )
    result.stdout.fnmatch_lines(["*needs 8 GPUs*"])


def test_the_budget_stretches_only_for_other_programs_load():
    from tests.nbval_budget import allowed_seconds

    assert allowed_seconds(60, 0.3, 2) == 60  # an idle machine
    assert allowed_seconds(60, 2.0, 2) == 60  # the notebook keeps both cores busy itself
    assert allowed_seconds(60, 4.0, 2) == 120  # another run takes half the machine
    assert allowed_seconds(60, 7.0, 16) == 60  # a big machine with spare cores
