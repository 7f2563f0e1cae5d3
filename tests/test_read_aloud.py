"""Every notebook reads its main result aloud: a `**Predict:**` line before the lesson's first
timed run (the learner commits to a guess), and a markdown cell starting `**What to look at.**`
after a result (the numbers that carry the lesson, with reference figures).

What counts, found in the notebook's code, not in a list kept here:
- the lesson: its numbered sections (tests/notebook_sections.py), neither an Explore section nor
  anything from `## Summary`, `## Exercises` or `## Solutions` on;
- a timed run: a lesson code cell whose own statements (not the bodies of the functions it
  defines) time or record a measurement (`timing.benchmark(`, `timing.Timer(`,
  `timing.measurement(`, `time.perf_counter(`, `doctor.watch(`, `record.measure(`), or use a
  function defined in the notebook that does, directly or through another such function;
- a result: a lesson code cell that is a timed run, or records a figure or a verdict
  (`record.figure(`, `record.judge(`).

The rules: the lesson's first timed run has a `**Predict:**` line in the markdown before it, in
its section or in the markdown that leads into that section (since the code cell before it); a
`**What to look at.**` cell comes after that run; and each such cell follows a result by at most
`WITHIN` cells, in the same section.
Cost: reads 21 notebooks' JSON and parses their code, about a second.
"""

from __future__ import annotations

import ast
import copy
import tomllib
from pathlib import Path

import nbformat
import pytest

from tests.notebook_sections import _parse, sections

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = [
    ROOT / "notebooks" / nb["file"]
    for nb in tomllib.loads((ROOT / "notebooks" / "catalog.toml").read_text())["notebook"]
]

PREDICT = "**Predict:**"
LOOK = "**What to look at.**"
TIMED = {
    ("timing", "benchmark"),
    ("timing", "Timer"),
    ("timing", "measurement"),
    ("time", "perf_counter"),
    ("doctor", "watch"),
    ("record", "measure"),
}
RESULT = TIMED | {("record", "figure"), ("record", "judge")}
AFTER_LESSON = ("summary", "exercises", "solutions")
WITHIN = 3  # cells between a result and the markdown that reads it aloud


def _calls(nodes: list[ast.AST], kinds: set[tuple[str, str]]) -> bool:
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and (n.func.value.id, n.func.attr) in kinds
        for top in nodes
        for n in ast.walk(top)
    )


def _names(nodes: list[ast.AST]) -> set[str]:
    return {
        n.id
        for top in nodes
        for n in ast.walk(top)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }


def _timing_functions(nb: nbformat.NotebookNode) -> set[str]:
    """The notebook's functions that time or record a measurement, directly or through another."""
    defs = {
        node.name: node
        for cell in nb.cells
        if cell.cell_type == "code"
        for node in ast.walk(_parse(cell.source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    timed = {name for name, fn in defs.items() if _calls(fn.body, TIMED)}
    while True:
        more = {name for name, fn in defs.items() if _names(fn.body) & timed} - timed
        if not more:
            return timed
        timed |= more


def _own_statements(source: str) -> list[ast.AST]:
    """What a cell runs itself: its statements, less the bodies of what it defines."""
    own = []
    for node in _parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            args = getattr(node, "args", None)  # a class has none
            own += [*node.decorator_list, *(args.defaults if args else [])]
        else:
            own.append(node)
    return own


def lesson(nb: nbformat.NotebookNode) -> list[tuple[int, int]]:
    """(cell index, section number) of every cell in the lesson's sections, in order."""
    _, secs = sections(nb)
    starts = [  # the cells that open a section, by the same rule
        i for i, c in enumerate(nb.cells) if sections(nbformat.v4.new_notebook(cells=[c]))[1]
    ]
    out = []
    for k, (sec, start) in enumerate(zip(secs, starts, strict=True)):
        if sec.title.lower().startswith(AFTER_LESSON):
            break
        if not sec.explore:
            end = starts[k + 1] if k + 1 < len(starts) else len(nb.cells)
            out += [(i, k) for i in range(start, end)]
    return out


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """What the notebook lacks to read its main result aloud; empty when it reads it."""
    timing_fns = _timing_functions(nb)
    cells = lesson(nb)
    section = dict(cells)

    def timed(i: int) -> bool:
        own = _own_statements(nb.cells[i].source)
        return _calls(own, TIMED) or bool(_names(own) & timing_fns)

    code = [i for i, _ in cells if nb.cells[i].cell_type == "code"]
    runs = [i for i in code if timed(i)]
    if not runs:
        return []
    first = runs[0]
    out = []
    # the run's section before it, and the markdown that leads into that section
    opens = min(i for i, k in cells if k == section[first])
    since = max((i for i in range(opens) if nb.cells[i].cell_type == "code"), default=-1) + 1
    before = [c.source for c in nb.cells[since:first] if c.cell_type == "markdown"]
    if not any(PREDICT in s for s in before):
        out.append(f"cell {first} (the lesson's first timed run) has no {PREDICT} line before it")
    results = {i for i in code if i in runs or _calls(_own_statements(nb.cells[i].source), RESULT)}
    looks = [
        i
        for i, _ in cells
        if nb.cells[i].cell_type == "markdown" and nb.cells[i].source.lstrip().startswith(LOOK)
    ]
    if not [i for i in looks if i > first]:
        out.append(f"no markdown cell starting {LOOK} after the first timed run (cell {first})")
    for i in looks:
        near = [j for j in range(i - WITHIN, i) if j in results and section.get(j) == section[i]]
        if not near:
            out.append(f"cell {i}'s {LOOK} follows no result within {WITHIN} cells")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_main_result_is_read_aloud(path):
    found = problems(nbformat.read(path, as_version=4))
    assert not found, found


def _planted() -> nbformat.NotebookNode:
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    return nbformat.v4.new_notebook(
        cells=[
            md("# A planted notebook"),
            code("from helpers import timing"),
            md("## 1. A comparison"),
            code("def run(f):\n    return timing.benchmark(f, repeats=3)"),
            md(f"{PREDICT} which is faster?"),
            code("a, b = run(f), run(g)"),
            code("record.figure(fig, 'a_vs_b')"),
            md(f"{LOOK} the ratio of the bars."),
            md("## Explore"),
            code("timing.benchmark(f)"),
            md("## Summary\n- done"),
        ]
    )


def test_a_planted_notebook_that_reads_aloud_passes():
    assert problems(_planted()) == []


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda cells: cells.pop(4), "has no **Predict:** line"),
        (lambda cells: cells.pop(7), "no markdown cell starting **What to look at.**"),
        # the guess is written after the run it should precede
        (lambda cells: cells.insert(6, cells.pop(4)), "has no **Predict:** line"),
        # the reading is far from any result: past the next section's heading
        (lambda cells: cells.insert(9, cells.pop(7)), "no markdown cell starting"),
        # a reading with no result before it: it reads nothing aloud
        (
            lambda cells: cells.insert(3, nbformat.v4.new_markdown_cell(f"{LOOK} the bars.")),
            "follows no result",
        ),
    ],
    ids=[
        "no-predict",
        "no-what-to-look-at",
        "predict-after-the-run",
        "look-outside-its-section",
        "look-before-any-result",
    ],
)
def test_a_planted_notebook_without_them_fails(change, expected):
    nb = copy.deepcopy(_planted())
    change(nb.cells)
    assert any(expected in p for p in problems(nb)), problems(nb)
