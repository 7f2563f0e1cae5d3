"""The notebook budget plugin really fails: over budget, missing from the catalog, or a skip."""

import textwrap

import nbformat
import pytest

pytest_plugins = ["pytester"]


def _setup(pytester, seconds, catalog_entry):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"import time\ntime.sleep({seconds})")]
    nbformat.write(nb, pytester.path / "99_tiny.ipynb")
    (pytester.path / "catalog.toml").write_text(textwrap.dedent(catalog_entry))
    import os

    os.environ["FTG_CATALOG"] = str(pytester.path / "catalog.toml")  # restored by the fixture


def _run(pytester):
    return pytester.runpytest_subprocess("--nbval-lax", "--nbval-current-env", "-p", "tests.nbval_budget",
                                         "99_tiny.ipynb", "-p", "no:cacheprovider")


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
    monkeypatch.setenv("FTG_CATALOG", "")  # registers it for restoring; _setup sets the value


def test_within_budget_passes(pytester):
    _setup(pytester, 0, ENTRY.format(budget=60, extra=""))
    _run(pytester).assert_outcomes(passed=2)


def test_over_budget_fails(pytester):
    _setup(pytester, 1.5, ENTRY.format(budget=1, extra=""))
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
    result = pytester.runpytest_subprocess("--nbval-lax", "--nbval-current-env", "-p", "tests.nbval_budget",
                                           "99_tiny.ipynb", "-rs")
    result.stdout.fnmatch_lines(["*needs 8 GPUs*"])
