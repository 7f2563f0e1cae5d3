"""Every notebook is a unit that ends with exercises and has one parameters cell.

How long a unit is (code cells, words of markdown, code lines) is not limited here: a cap met by
trimming prose is a target, not a ceiling. `python scripts/code_size.py --notebooks` reports each
notebook's cells and words for a reader to judge, and a unit that grows past a sitting is split
(DEVELOPERS.md). The exercises:
a markdown cell that starts `## Exercises` with a numbered list of at least three, and at least
three code cells tagged `solution`, each asserting the answer it teaches. One code cell is
tagged `parameters` (papermill's convention: a tool overrides the sizes in a cell after it). A
word is what `str.split()` finds.
"""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
MIN_EXERCISES = 3


def _read(path: Path) -> list[dict]:
    return [
        {
            "kind": c["cell_type"],
            "source": "".join(c["source"]),
            "tags": c.get("metadata", {}).get("tags", []),
        }
        for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
    ]


def _numbered_items(text: str) -> int:
    """Items of a numbered list at the left margin ('1. ...'); a nested list's are not counted."""
    return len(re.findall(r"^\d+\.\s", text, flags=re.M))


def problems(cells: list[dict]) -> list[str]:
    """Every way `cells` (kind, source, tags) lacks the exercises, their solutions or the one
    parameters cell."""
    markdown = [c["source"] for c in cells if c["kind"] == "markdown"]
    found = []
    exercises = [m for m in markdown if m.lstrip().startswith("## Exercises")]
    if not exercises or _numbered_items(exercises[0]) < MIN_EXERCISES:
        found.append(
            f"no '## Exercises' markdown cell with a numbered list of at least {MIN_EXERCISES}"
        )
    solutions = [c["source"] for c in cells if c["kind"] == "code" and "solution" in c["tags"]]
    if len(solutions) < MIN_EXERCISES:
        found.append(f"{len(solutions)} code cells tagged 'solution' (at least {MIN_EXERCISES})")
    found += [
        f"a solution without an assert: {s.splitlines()[0][:60]!r}"
        for s in solutions
        if "assert" not in s
    ]
    parameters = [c for c in cells if c["kind"] == "code" and "parameters" in c["tags"]]
    if len(parameters) != 1:
        found.append(f"{len(parameters)} code cells tagged 'parameters' (exactly one)")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_a_unit(path):
    assert problems(_read(path)) == []


def _unit(**change) -> list[dict]:
    """A notebook with its exercises, solutions and parameters cell, with one part changed."""
    cells = {
        "title": [{"kind": "markdown", "source": "# Title\n\nwords " * 10, "tags": []}],
        "parameters": [{"kind": "code", "source": "SIZE = 8", "tags": ["parameters"]}],
        "code": [{"kind": "code", "source": "x = 1\n" * 30, "tags": []}] * 21,
        "exercises": [
            {
                "kind": "markdown",
                "tags": [],
                "source": "## Exercises\n\n1. **Predict.** a\n"
                "2. **Change a knob.** b\n   1. a nested step\n3. **Find the bug.** c\n",
            }
        ],
        "solutions": [
            {"kind": "code", "source": "# Solution 1\nassert 1 + 1 == 2", "tags": ["solution"]}
        ]
        * 3,
    }
    cells.update(change)
    return [c for part in cells.values() for c in part]


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"parameters": []}, "0 code cells tagged 'parameters'"),
        ({"exercises": []}, "no '## Exercises' markdown cell"),
        (
            {
                "exercises": [
                    {
                        "kind": "markdown",
                        "source": "## Exercises\n\n1. a\n2. b\n   3. c",
                        "tags": [],
                    }
                ]
            },
            "no '## Exercises' markdown cell",
        ),
        (
            {"solutions": [{"kind": "code", "source": "assert True", "tags": ["solution"]}] * 2},
            "2 code cells tagged",
        ),
        (
            {"solutions": [{"kind": "code", "source": "print(1)", "tags": ["solution"]}] * 3},
            "a solution without an assert",
        ),
    ],
)
def test_the_unit_check_can_fail(change, problem):
    assert problems(_unit()) == []
    found = problems(_unit(**change))
    assert len(found) >= 1 and any(problem in f for f in found), found


def test_a_long_unit_is_no_failure():
    """Many cells, many words and a long cell are a reader's judgement (code_size.py reports
    them), not a failure."""
    long_cells = [{"kind": "code", "source": "x = 1\n" * 80, "tags": []}] * 40
    many_words = [{"kind": "markdown", "source": "word " * 400, "tags": []}] * 10
    assert problems(_unit(code=long_cells, title=many_words)) == []
