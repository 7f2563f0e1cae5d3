"""The guide's minutes (notebooks/README.md): every sitting fits 90 minutes, the sums are right,
and the session plans' slots hold the sections they name.

A unit's "Minutes (estimated, CPU / GPU): label c/g · ... · **total C/G**" line counts each
section once. A unit within 90 minutes (CPU and GPU) is one sitting. A longer one lists
"Sitting k (CPU / GPU): ... · **sitting k total C/G**" lines: each within 90, each adding up to
its total, together holding each section of the unit once with the unit's minutes, the
exercises split by number ("exercise 2", "exercises 1 and 3") so that their parts add up to the
unit's exercise minutes and name each exercise once, plus "re-run the cells above" in a later
sitting (a fresh kernel needs the earlier sections' results; not part of the unit's total).

The session plans' tables name, per slot ("0–15"), the sections taught ("01: setup, 6 batch
doubling; 17: ...", labels exactly as in the unit's minutes line, or "exercise K", one
exercise = the unit's exercise minutes / its number of exercises, rounded up) and the sections
skipped ("01: 2–5, 7, Explore, exercises"); the taught minutes must fit the slot on a CPU and on
a GPU, match the "Minutes taught" line under the table, and every section of a named unit must
be taught or skipped somewhere in the plan. Reads the guide and 21 notebooks: about a second.
"""

import math
import re

import pytest

from helpers.suite import catalog
from tests import notebook_sections as ns

SITTING = 90  # minutes: what one sitting of a unit may take (notebooks/README.md)
README = catalog.README.read_text()
ENTRIES = catalog.load()
NUMBERS = [catalog.number(e["file"]) for e in ENTRIES]
FILES = {catalog.number(e["file"]): catalog.README.parent / e["file"] for e in ENTRIES}
PLANS = ("**A 90-minute session**", "**A 3-hour lab**")
RERUN = "re-run the cells above"


def items(text: str) -> tuple[list[tuple[str, int, int]], tuple[int, int]]:
    """A minutes line's "label c/g" items and its bold total."""
    total = re.search(r"\*\*[^*]*total (\d+)/(\d+)\*\*", text)
    assert total, f"no bold total in {text!r}"
    body = text[: total.start()]
    found = re.findall(r"(?:^|·)\s*([^·]*?)\s+(\d+)/(\d+)\s*(?=·|$)", body.strip())
    return [(label, int(c), int(g)) for label, c, g in found], (
        int(total.group(1)),
        int(total.group(2)),
    )


def units(readme: str = README) -> dict[str, dict]:
    """Per unit: its minutes items and total, and its sittings (items and totals)."""
    parts = re.split(r"^### (\d\d[a-z]?) — .*$", readme, flags=re.M)
    out = {}
    for num, body in zip(parts[1::2], parts[2::2], strict=True):
        body = body.split("\n## ", 1)[0]
        line = re.search(r"^Minutes \(estimated, CPU / GPU[^)]*\):(.*)$", body, flags=re.M)
        sittings = re.findall(r"^Sitting (\d+) \(CPU / GPU\):(.*)$", body, flags=re.M)
        out[num] = {
            "minutes": items(line.group(1)),
            "sittings": [(int(k), *items(text)) for k, text in sittings],
        }
    return out


def _sum(found) -> tuple[int, int]:
    return sum(c for _, c, _ in found), sum(g for _, _, g in found)


def exercise_numbers(label: str) -> list[int]:
    """ "exercise 2" -> [2]; "exercises 1 and 3" -> [1, 3]; "exercises 2–4" -> [2, 3, 4]."""
    found = []
    for a, b, one in re.findall(r"(\d+)\s*[–-]\s*(\d+)|(\d+)", label):
        found += list(range(int(a), int(b) + 1)) if a else [int(one)]
    return found


def exercise_count(num: str) -> int:
    nb = ns.read(FILES[num])
    text = next(c.source for c in nb.cells if c.source.lstrip().startswith("## Exercises"))
    return len(re.findall(r"^\d+\.\s", text, flags=re.M))


def unit_problems(num: str, unit: dict, exercises: int) -> list[str]:
    """Every way a unit's minutes or sittings break the rules in this module's docstring."""
    found_items, total = unit["minutes"]
    found = []
    if _sum(found_items) != total:
        found.append(f"{num}: sections add up to {_sum(found_items)}, the total says {total}")
    if not unit["sittings"]:
        if max(total) > SITTING:
            found.append(f"{num}: {total[0]}/{total[1]} minutes in one sitting")
        return found
    sections = [it for it in found_items if it[0] != "exercises"]
    exercise_minutes = [(c, g) for label, c, g in found_items if label == "exercises"]
    held, parts, named = [], [], []
    for i, (k, its, stated) in enumerate(unit["sittings"], start=1):
        if k != i:
            found.append(f"{num}: sitting {k} where sitting {i} was expected")
        if _sum(its) != stated:
            found.append(f"{num}: sitting {k} adds up to {_sum(its)}, its total says {stated}")
        if max(stated) > SITTING:
            found.append(f"{num}: sitting {k} takes {stated[0]}/{stated[1]} minutes")
        for it in its:
            if it[0] == RERUN and k > 1:
                continue
            if it[0].startswith("exercise"):
                parts.append(it[1:])
                named += exercise_numbers(it[0])
            elif it in sections:
                held.append(it)
            else:
                found.append(f"{num}: sitting {k} holds {it}, not a section of the unit")
    if len(unit["sittings"]) < 2:
        found.append(f"{num}: one sitting listed; list two or more, or none")
    if sorted(held) != sorted(sections):
        found.append(f"{num}: the sittings hold {sorted(held)}, the unit has {sorted(sections)}")
    if exercise_minutes and tuple(map(sum, zip(*parts, strict=True))) != exercise_minutes[0]:
        found.append(f"{num}: exercise parts {parts} do not add up to {exercise_minutes[0]}")
    if sorted(named) != list(range(1, exercises + 1)):
        found.append(f"{num}: the sittings name exercises {named}, the notebook has {exercises}")
    return found


UNITS = units()


@pytest.mark.parametrize("num", NUMBERS)
def test_each_sitting_fits_and_the_sums_are_right(num):
    assert unit_problems(num, UNITS[num], exercise_count(num)) == []


@pytest.mark.parametrize("num", NUMBERS)
def test_minutes_name_every_section_of_the_notebook(num):
    _, secs = ns.sections(ns.read(FILES[num]))
    labels = [lab for lab, _, _ in UNITS[num]["minutes"][0]]
    numbered = [lab.split()[0] for lab in labels if re.match(r"(\d+|\([a-z]\))(\s|$)", lab)]
    assert numbered == [s.label for s in secs if s.label]
    if any(s.explore for s in secs):
        assert any("Explore" in lab for lab in labels), f"{num}: its Explore has no minutes"


def test_a_sitting_over_the_limit_or_wrong_sum_is_found():
    unit = units(
        "### 99 — t\n\nMinutes (estimated, CPU / GPU): setup 5/5 · 1 a 60/70 · 2 b 30/30 · "
        "exercises 15/15 · **total 110/120**\n"
    )["99"]
    assert unit_problems("99", unit, 3) == ["99: 110/120 minutes in one sitting"]
    split = (
        "\n\nSitting 1 (CPU / GPU): setup 5/5 · 1 a 60/70 · exercise 1 5/5 · "
        "**sitting 1 total 70/80**\n\nSitting 2 (CPU / GPU): re-run the cells above 2/2 · "
        "2 b 30/30 · exercises 2 and 3 10/10 · **sitting 2 total 42/42**\n"
    )
    good = "### 99 — t\n\nMinutes (estimated, CPU / GPU): setup 5/5 · 1 a 60/70 · 2 b 30/30 · "
    good += "exercises 15/15 · **total 110/120**" + split
    assert unit_problems("99", units(good)["99"], 3) == []
    assert unit_problems("99", units(good.replace("1 a 60/70", "1 a 60/90"))["99"], 3) == [
        "99: sections add up to (110, 140), the total says (110, 120)",
        "99: sitting 1 adds up to (70, 100), its total says (70, 80)",
    ]
    both = good.replace("sitting 1 total 70/80", "sitting 1 total 95/95")
    assert "99: sitting 1 takes 95/95 minutes" in unit_problems("99", units(both)["99"], 3)
    assert "99: the sittings name exercises [1, 2], the notebook has 3" in unit_problems(
        "99", units(good.replace("exercises 2 and 3", "exercise 2"))["99"], 3
    )
    assert unit_problems("99", units(good.replace("2 b 30/30 · ", ""))["99"], 3) != []


# --- the session plans ---------------------------------------------------------------------


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _by_unit(cell: str) -> dict[str, list[str]]:
    """ "01: setup, 6 batch doubling; 17: 2 the profiler" -> {"01": ["setup", ...], "17": [...]}"""
    out: dict[str, list[str]] = {}
    for part in filter(None, (p.strip() for p in cell.split(";"))):
        if part == "—":
            continue
        num, rest = re.fullmatch(r"(\d\d[a-z]?): (.*)", part).groups()
        out.setdefault(num, []).extend(x.strip() for x in rest.split(","))
    return out


def _cost(num: str, label: str) -> tuple[int, int]:
    found_items = UNITS[num]["minutes"][0]
    if re.fullmatch(r"exercise \d+", label):
        (c, g) = next((c, g) for lab, c, g in found_items if lab == "exercises")
        n = exercise_count(num)
        return math.ceil(c / n), math.ceil(g / n)
    matches = [(c, g) for lab, c, g in found_items if lab == label]
    assert matches, f"{num} has no section {label!r} in its minutes line"
    return matches[0]


def _skipped(num: str, label: str) -> set[str]:
    """The unit's minutes labels that a skipped item names: "2–5", "7", "exercises ...", a label."""
    labels = [lab for lab, _, _ in UNITS[num]["minutes"][0]]
    if label.startswith("exercise"):
        return {"exercises"}
    m = re.fullmatch(r"(\d+)(?:–(\d+))?", label)
    if m:
        wanted = {str(i) for i in range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1)}
        return {lab for lab in labels if lab.split()[0] in wanted}
    return {label} & set(labels)


def plan_problems(text: str) -> list[str]:
    """Every slot of a plan (its table, then its "Minutes taught" line) that does not fit."""
    table, rest = text.split("\n\n", 2)[1:3]
    stated = re.search(r"^Minutes taught \(CPU / GPU\): (.*)$", rest, flags=re.M)
    found, shown, covered, named = [], {}, {}, set()
    for row in table.splitlines()[2:]:
        slot, _, taught, skipped = _cells(row)
        a, b = map(int, slot.split("–"))
        for num, labels in _by_unit(skipped).items():
            for label in labels:
                names = _skipped(num, label)
                if not names:
                    found.append(f"{slot}: {num} has no section {label!r} to skip")
                covered.setdefault(num, set()).update(names)
        taught_units = _by_unit(taught)
        if not taught_units:
            continue
        cost = [(0, 0)]
        for num, labels in taught_units.items():
            named.add(num)
            for label in labels:
                cost.append(_cost(num, label))
                covered.setdefault(num, set()).add(
                    "exercises" if label.startswith("exercise") else label
                )
        c, g = map(sum, zip(*cost, strict=True))
        shown[slot] = f"{c}/{g}"
        if max(c, g) > b - a:
            found.append(f"{slot}: the sections taught take {c}/{g} minutes")
    for num in sorted(named):
        missing = {lab for lab, _, _ in UNITS[num]["minutes"][0]} - covered.get(num, set())
        if missing:
            found.append(f"{num}: neither taught nor skipped: {sorted(missing)}")
    line = " · ".join(f"{slot} {m}" for slot, m in shown.items())
    if not stated or stated.group(1).strip() != line:
        found.append(f"the line under the table should read 'Minutes taught (CPU / GPU): {line}'")
    return found


@pytest.mark.parametrize("plan", PLANS)
def test_each_slot_of_a_plan_holds_its_sections(plan):
    assert plan_problems(README.split(plan, 1)[1]) == []


def test_a_slot_that_overflows_is_found():
    text = README.split(PLANS[0], 1)[1]
    row = "| 0–15 | timing honestly (the instructor runs it) | 00: setup, 4 timing properly |"
    assert row in text
    over = text.replace(row, row.replace("00: setup,", "00: setup, 3 asynchronous execution,"))
    assert plan_problems(over)[0] == "0–15: the sections taught take 21/21 minutes"
    gone = text.replace("00: 1–3, 5, exercises", "00: 1–3, exercises")
    assert plan_problems(gone) == ["00: neither taught nor skipped: ['5 a matmul rate']"]
