"""Each notebook's "**Prerequisites:**" line names every unit by number and title, as the catalog
does, and only units that come earlier in the catalog.

The line is the text after `**Prerequisites:**` in the notebook's first markdown cell, up to the
next `**`. Every unit number in it (`07`, `11b`) must be followed by its title in parentheses:
the catalog's title, or its short form, the title up to its first ":" or "," (or up to and
including a "?" that comes first): "Data loading" for "Data loading: where a sample's time goes",
"Why is it slow?" for "Why is it slow? Compute-, memory- or overhead-bound". Backticks are
ignored, so "`.item()` hygiene ..." names ".item() hygiene ...". A range ("03-11") or a bare
number names no title and fails. The guide's unit headings (notebooks/README.md, "### NN — title")
follow the same rule. Reads 21 notebooks' JSON: well under a second.
"""

import json
import re

import pytest

from helpers.suite import catalog

ENTRIES = catalog.load()
ORDER = [catalog.number(e["file"]) for e in ENTRIES]
TITLES = {catalog.number(e["file"]): e["title"] for e in ENTRIES}
NOTEBOOKS = catalog.README.parent
MARK = "**Prerequisites:**"
UNIT = re.compile(r"(?<![\w.])(\d\d[a-z]?)(?![\w])")


def short_title(title: str) -> str:
    """The title up to its first ':' or ',', or up to and including a '?' that comes first."""
    m = re.match(r"[^:,?]*\??", title)
    return m.group(0).strip()


def names_unit(named: str, number: str) -> bool:
    """Whether `named` (backticks ignored) is the catalog's title of `number` or its short form."""
    title = TITLES[number]
    return named.replace("`", "") in (title, short_title(title))


def _parenthesised(text: str) -> str | None:
    """The text of the balanced parentheses that `text` starts with (after one space), or None."""
    if not text.startswith(" ("):
        return None
    depth = 0
    for i, ch in enumerate(text[1:], start=1):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return text[2:i]
    return None


def prerequisite_line(markdown: str) -> str:
    return " ".join(markdown.split(MARK, 1)[1].split("**", 1)[0].split())


def problems(markdown: str, number: str) -> list[str]:
    """Every unit the prerequisites line of notebook `number` names wrongly."""
    line = prerequisite_line(markdown)
    found = []
    for m in UNIT.finditer(line):
        nn = m.group(1)
        named = _parenthesised(line[m.end() :])
        if nn not in TITLES:
            found.append(f"{nn} is not a unit in catalog.toml")
        elif ORDER.index(nn) >= ORDER.index(number):
            found.append(f"{nn} does not come before {number} in catalog.toml")
        elif named is None:
            found.append(f"{nn} is named without its title in parentheses")
        elif not names_unit(named, nn):
            found.append(
                f"{nn} ({named}) is not titled as in catalog.toml: "
                f"{TITLES[nn]!r} or {short_title(TITLES[nn])!r}"
            )
    return found


def _first_cell(entry: dict) -> str:
    nb = json.loads((NOTEBOOKS / entry["file"]).read_text(encoding="utf-8"))
    return next("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


@pytest.mark.parametrize("entry", ENTRIES, ids=ORDER)
def test_prerequisites_name_earlier_units_by_number_and_title(entry):
    text = _first_cell(entry)
    assert MARK in text, f"{entry['file']}: no {MARK} line in its first markdown cell"
    assert problems(text, catalog.number(entry["file"])) == []


def test_guide_headings_use_the_catalog_titles():
    headings = dict(re.findall(r"^### (\d\d[a-z]?) — (.*)$", catalog.README.read_text(), re.M))
    assert sorted(headings) == sorted(TITLES)
    assert [nn for nn, title in headings.items() if not names_unit(title, nn)] == []


def test_short_titles():
    assert short_title("Data loading: where a sample's time goes") == "Data loading"
    assert short_title("Your machine, and how to time it honestly") == "Your machine"
    assert short_title("Why is it slow? Compute-, memory- or overhead-bound") == "Why is it slow?"
    assert short_title("Where training memory goes") == "Where training memory goes"


def test_a_planted_wrong_line_fails():
    def line(text):
        return f"# t\n\n{MARK} {text} **Hardware:** 12 GB."

    good = line("notebooks 00 (Your machine), 08 (`.item()` hygiene and hidden synchronisations).")
    assert problems(good, "09") == []
    # the old numbering: "01 (data)" once meant data loading
    assert problems(line("notebook 01 (data)."), "06") == [
        "01 (data) is not titled as in catalog.toml: "
        "'Why is it slow? Compute-, memory- or overhead-bound' or 'Why is it slow?'"
    ]
    assert problems(line("notebooks 03-11 and 04."), "18") == [
        "03 is named without its title in parentheses",
        "11 is named without its title in parentheses",
        "04 is named without its title in parentheses",
    ]
    assert problems(line("notebook 16 (DistributedDataParallel on one machine)."), "12") == [
        "16 does not come before 12 in catalog.toml"
    ]
    assert problems(line("notebook 14 (Attention and variable-length sequences)."), "12") != []
    assert problems(line("notebook 42 (Everything)."), "19") == ["42 is not a unit in catalog.toml"]
    assert problems(line("notebook 13 (`torch.compile`)."), "12") != []
