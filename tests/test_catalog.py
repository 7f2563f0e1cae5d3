"""The notebook catalog lists every notebook with its needs and measured smoke time."""

import json
import re
from pathlib import Path

import pytest

from helpers.suite import catalog

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CATALOG = {e["file"]: e for e in catalog.load()}
ON_DISK = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


def test_every_notebook_is_catalogued_and_vice_versa():
    assert ON_DISK, "no notebooks found"
    assert sorted(CATALOG) == ON_DISK


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_entry(name):
    e = CATALOG[name]
    assert e["needs"] in ("cpu", "1 gpu", ">=2 gpus"), e["needs"]
    assert e["title"]
    assert 0 < e["smoke_seconds"] <= e["budget_seconds"], "measure the smoke run and record it"
    assert e["budget_seconds"] <= 90
    if "skip_reason" in e:
        assert e["skip_reason"].strip(), "a skipped notebook must say why"


@pytest.mark.parametrize("name", ON_DISK)
def test_notebook_is_committed_without_outputs(name):
    nb = json.loads((NOTEBOOKS / name).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, name


def test_the_readme_table_of_notebooks_is_the_catalog():
    """README.md's table names each notebook's title, needs and claims as the catalog does (the
    catalog is the one source of which notebook tests which claim)."""
    readme = (NOTEBOOKS.parent / "README.md").read_text()
    table = readme.split("\n## Notebooks\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(
        r"^\| (\d\d) \| \[(.+?)\]\(notebooks/(.+?)\) \| (.+?) \| (.+?) \|$", table, flags=re.M
    )
    assert [r[2] for r in rows] == list(CATALOG), (
        "README.md's notebook table: not the catalog's notebooks in order"
    )
    for num, title, file, needs, claims in rows:
        e = CATALOG[file]
        assert (num, title, needs) == (file[:2], e["title"], e["needs"]), file
        assert claims == (", ".join(e["claims"]) or "—"), (
            f"README.md lists claims {claims} for {file}"
        )
