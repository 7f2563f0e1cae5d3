"""notebooks/README.md (the instructors' guide) stays in step with notebooks/catalog.toml."""

import re

import pytest

from helpers.suite import catalog

ENTRIES = catalog.load()
README = catalog.README.read_text()


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_every_catalog_notebook_is_in_the_guide(entry):
    assert f"[`{entry['file']}`]({entry['file']})" in README, (
        f"{entry['file']} is missing from notebooks/README.md: "
        "run `python -m helpers.suite.catalog`"
    )


def test_runtime_table_is_up_to_date():
    assert catalog.render_readme(README, ENTRIES) == README, (
        "the run-time table in notebooks/README.md differs from catalog.toml: "
        "run `python -m helpers.suite.catalog`"
    )


def test_table_rows_are_the_catalog_in_order():
    block = README.split(catalog.BEGIN, 1)[1].split(catalog.END, 1)[0]
    files = re.findall(r"^\| \[`([^`]+)`\]", block, flags=re.M)
    assert files == [e["file"] for e in ENTRIES]


def test_budgets_are_labelled_and_times_are_measured_or_say_so():
    entry = {
        "file": "99_x.ipynb",
        "title": "t",
        "needs": "cpu",
        "smoke_seconds": 30,
        "budget_seconds": 60,
        "budget_seconds_t4": 90,
        "budget_seconds_h100": 45,
    }
    row = catalog.runtime_table([entry]).splitlines()[-1]
    assert "| 30 s (budget 60 s) | 90 s / 45 s | not measured yet |" in row
    entry["measured"] = [{"run": "2026-11-27_NVIDIA-H100", "profile": "gpu", "seconds": 200}]
    row = catalog.runtime_table([entry]).splitlines()[-1]
    assert "| 3.3 min (gpu profile, NVIDIA-H100, 2026-11-27) |" in row


def test_guide_tells_how_to_reset():
    assert "make clean" in README


def test_render_needs_the_markers():
    with pytest.raises(ValueError, match="must hold the markers"):
        catalog.render_readme("no markers here", ENTRIES)


def _unit_blocks() -> dict[str, str]:
    """The guide's "### NN — title" blocks, by notebook number."""
    parts = re.split(r"^### (\d\d[a-z]?) — .*$", README, flags=re.M)
    return {
        num: body.split("\n## ", 1)[0] for num, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def test_every_unit_has_objectives_and_minutes_and_nothing_else_does():
    blocks = _unit_blocks()
    assert sorted(blocks) == sorted(catalog.number(e["file"]) for e in ENTRIES)
    for num, body in blocks.items():
        assert len(re.findall(r"^- ", body, flags=re.M)) >= 2, f"{num}: at least two objectives"
        minutes = re.search(r"^Minutes \(estimated, CPU / GPU[^)]*\):(.*)$", body, flags=re.M)
        assert minutes and re.search(r"\*\*total \d+/\d+\*\*", minutes.group(1)), f"{num}: minutes"
        sections = re.findall(r"· [^·]*? (\d+)/(\d+)", " · " + minutes.group(1))
        total = re.search(r"total (\d+)/(\d+)", minutes.group(1))
        assert sum(int(c) for c, _ in sections[:-1]) == int(total.group(1)), f"{num}: CPU total"
        assert sum(int(g) for _, g in sections[:-1]) == int(total.group(2)), f"{num}: GPU total"


def test_session_plans_name_only_units_that_exist():
    numbers = {catalog.number(e["file"]) for e in ENTRIES}
    for plan in ("**A 90-minute session**", "**A 3-hour lab**"):
        table = README.split(plan, 1)[1].split("\n\n", 2)[1]
        named = set(
            re.findall(
                r"\b(\d\d[a-z]?)\b(?! ?[–-]\d)", re.sub(r"^\| [\d–]+ \|", "|", table, flags=re.M)
            )
        )
        assert named and named <= numbers, f"{plan}: {sorted(named - numbers)} are not notebooks"


def test_old_numbers_map_to_new_ones():
    """Instructors' notes that use the numbering before the course was renumbered still work."""
    table = README.split("### The numbering changed", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d\d[a-z]?) \| (\d\d) \| ([^|]+) \|$", table, flags=re.M)
    assert rows, "no old -> new rows"
    olds = [o for o, _, _ in rows]
    assert len(set(olds)) == len(olds), "an old number listed twice"
    files = {p.name[:2]: p.stem for p in catalog.README.parent.glob("[0-9][0-9]_*.ipynb")}
    for o, n, unit in rows:
        assert n in files and files[n].endswith(unit.strip().replace(" ", "_")), (o, n, unit)
        assert o != n, f"{o} did not change: not a row of this table"
