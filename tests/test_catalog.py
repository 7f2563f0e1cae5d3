"""The notebook catalog lists every notebook with its needs and measured smoke time."""

import json
from pathlib import Path

import pytest

from tests.nbval_budget import load_catalog

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CATALOG = load_catalog()
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
