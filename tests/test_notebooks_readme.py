"""notebooks/README.md (the instructors' guide) stays in step with notebooks/catalog.toml."""

import re

import pytest

from helpers.suite import catalog

ENTRIES = catalog.load()
README = catalog.README.read_text()


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_every_catalog_notebook_is_in_the_guide(entry):
    assert f"[`{entry['file']}`]({entry['file']})" in README, (
        f"{entry['file']} is missing from notebooks/README.md: run `python -m helpers.suite.catalog`")


def test_runtime_table_is_up_to_date():
    assert catalog.render_readme(README, ENTRIES) == README, (
        "the run-time table in notebooks/README.md differs from catalog.toml: "
        "run `python -m helpers.suite.catalog`")


def test_table_rows_are_the_catalog_in_order():
    block = README.split(catalog.BEGIN, 1)[1].split(catalog.END, 1)[0]
    files = re.findall(r"^\| \[`([^`]+)`\]", block, flags=re.M)
    assert files == [e["file"] for e in ENTRIES]


def test_times_are_measured_or_say_so():
    table = catalog.runtime_table([{"file": "99_x.ipynb", "title": "t", "needs": "cpu",
                                    "smoke_seconds": 30, "budget_seconds": 60,
                                    "full_seconds_gpu": 0, "full_seconds_cpu": 600}])
    row = table.splitlines()[-1]
    assert "| 30 s (budget 60 s) | 10.0 min | not measured yet | not measured yet |" in row


def test_guide_tells_how_to_reset():
    assert "make clean" in README


def test_render_needs_the_markers():
    with pytest.raises(ValueError, match="must hold the markers"):
        catalog.render_readme("no markers here", ENTRIES)
