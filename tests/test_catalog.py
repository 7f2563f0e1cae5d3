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
    assert e["budget_seconds"] <= 90 or e.get("budget_why", "").strip(), (
        "a smoke budget over 90 s says why the lesson needs it (budget_why)"
    )
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
        r"^\| (\d\d[a-z]?) \| \[(.+?)\]\(notebooks/(.+?)\) \| (.+?) \| (.+?) \|$", table, flags=re.M
    )
    assert [r[2] for r in rows] == list(CATALOG), (
        "README.md's notebook table: not the catalog's notebooks in order"
    )
    for num, title, file, needs, claims in rows:
        e = CATALOG[file]
        assert (num, title, needs) == (catalog.number(file), e["title"], e["needs"]), file
        assert claims == (", ".join(e["claims"]) or "—"), (
            f"README.md lists claims {claims} for {file}"
        )


REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"
GPU_BUDGETS = ("budget_seconds_t4", "budget_seconds_h100")


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_notebook_has_a_gpu_budget_within_three_minutes(name):
    e = CATALOG[name]
    assert all(isinstance(e.get(k), int) and 0 < e[k] <= 180 for k in GPU_BUDGETS), e
    assert e["budget_seconds_h100"] <= e["budget_seconds_t4"], "an H100 is not slower than a T4"


def test_the_suite_fits_twenty_minutes_on_a_t4():
    assert sum(e["budget_seconds_t4"] for e in CATALOG.values()) <= 20 * 60


def test_the_two_gpu_notebooks_have_a_budget_for_two_t4s():
    two_gpu = [n for n, e in CATALOG.items() if n[:2] in ("15", "16", "17", "18")]
    assert len(two_gpu) == 4
    assert all(0 < CATALOG[n].get("budget_seconds_2xt4", 0) <= 180 for n in two_gpu)


def test_measured_seconds_come_from_committed_runs():
    """A measured figure names its run; that run's committed seconds.json must hold it."""
    measured = [(n, m) for n, e in CATALOG.items() for m in e.get("measured", [])]
    for name, m in measured:
        path = REFERENCE / m["run"] / m["profile"] / "seconds.json"
        assert path.is_file(), f"{name}: {m['run']} has no committed {m['profile']}/seconds.json"
        runs = json.loads(path.read_text())["notebooks"][name.removesuffix(".ipynb")]["runs"]
        assert m["seconds"] in [r["seconds"] for r in runs if r["status"] == "ok"], (name, m)
        if m["profile"] == "gpu":  # the default GPU run keeps to its budget
            budget = "budget_seconds_h100" if "H100" in m["run"] else "budget_seconds_t4"
            assert m["seconds"] <= CATALOG[name][budget], (name, m)


# Words of a prerequisite's topic that say nothing about which notebook it is.
_FILLER = {"and", "the", "its", "how", "for", "with", "why", "what", "helps", "needs", "this"}


def _introduction(file: str) -> str:
    """A notebook's title cell: its title and what it teaches."""
    return "".join(json.loads((NOTEBOOKS / file).read_text())["cells"][0]["source"])


def prerequisite_problems(markdown: str, number: str) -> list[str]:
    """Each notebook a "**Prerequisites:**" line names as `NN (topic)` must come before `number`
    and share a word of its topic with that notebook's title, file name or introduction: a
    renumbering once left "01 (data)" pointing at the unit on bottlenecks."""
    line = markdown.split("**Prerequisites:**", 1)[1].split("**", 1)[0]
    found = []
    for nn, topic in re.findall(r"\b(\d\d[a-z]?) \(([^)]*)\)", line.replace("\n", " ")):
        entry = next((e for e in CATALOG.values() if catalog.number(e["file"]) == nn), None)
        if entry is None or not catalog.number(entry["file"]) < number:
            found.append(f"{nn} is not a notebook before {number}")
            continue
        names = f"{entry['title']} {entry['file']} {_introduction(entry['file'])}".lower()
        words = {w for w in re.findall(r"[a-z0-9]{3,}", topic.lower()) if w not in _FILLER}
        if not any(w[:5] in names for w in words):
            found.append(f"{nn} ({topic}) is not what {entry['file']} teaches")
    return found


@pytest.mark.parametrize("name", ON_DISK)
def test_prerequisites_name_the_notebooks_they_mean(name):
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    text = next("".join(c["source"]) for c in cells if "**Prerequisites:**" in "".join(c["source"]))
    assert prerequisite_problems(text, catalog.number(name)) == []


def test_a_renumbered_prerequisite_is_found():
    assert prerequisite_problems("**Prerequisites:** notebooks 00 (timing), 02 (data).", "06") == []
    assert prerequisite_problems("**Prerequisites:** notebooks 01 (data).", "06") == [
        "01 (data) is not what 01_why_is_it_slow.ipynb teaches"
    ]
    assert prerequisite_problems("**Prerequisites:** 02 (pipeline stages).", "12") != []
    assert prerequisite_problems("**Prerequisites:** 14 (ranks).", "12") == [
        "14 is not a notebook before 12"
    ]
