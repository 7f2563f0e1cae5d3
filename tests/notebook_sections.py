"""A notebook's sections as a learner sees them: setup, numbered sections, Explore sections.

A section starts at a level-2 markdown heading (`## 1. ...`) or at any heading that names an
Explore section (`### Explore: ...`); the code cells before the first section are the setup.
An Explore section may say, in one line of its markdown, what to run before it:
`**Run first:** sections 2-4`, `**Run first:** sections (a), (b) and (c)` (the labels its
headings start with) or `**Run first:** the sections above`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

HEADING = re.compile(r"^(#{2,3})\s+(.*)$", re.M)
LABEL = re.compile(r"^(\d+|\([a-z]\))(?=[\s.·:])")
RUN_FIRST = re.compile(r"\*\*Run first:\*\*\s*(the sections above|sections?\s+[^.\n]*)", re.I)


@dataclass
class Section:
    title: str
    label: str | None  # "2", "(a)" or None
    explore: bool
    code: list[int] = field(default_factory=list)  # indices of its code cells
    run_first: list[str] = field(default_factory=list)  # labels named by "**Run first:**"


def sections(nb: nbformat.NotebookNode) -> tuple[list[int], list[Section]]:
    """The setup's code cell indices and the sections, in notebook order."""
    setup: list[int] = []
    out: list[Section] = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            m = HEADING.search(cell.source)
            if m and (len(m.group(1)) == 2 or "explore" in m.group(2).lower()) \
                    and m.group(2).strip().lower() != "parameters":
                title = m.group(2).strip()
                label = LABEL.match(title)
                out.append(Section(title, label.group(1) if label else None, "explore" in title.lower()))
            if out:
                first = RUN_FIRST.search(cell.source)
                if first:
                    text = first.group(1).split("(")[0] if "above" in first.group(1) else first.group(1)
                    out[-1].run_first = ["above"] if "above" in text else _labels(text)
        elif cell.cell_type == "code":
            (out[-1].code if out else setup).append(i)
    return setup, out


def _labels(text: str) -> list[str]:
    labels: list[str] = []
    for a, b, letter in re.findall(r"(\d+)\s*[-–]\s*(\d+)|(\([a-z]\)|\d+)", text):
        labels += [str(n) for n in range(int(a), int(b) + 1)] if a else [letter]
    return labels


def prerequisites(secs: list[Section], explore: Section) -> list[int]:
    """Code cells of the sections an Explore section says to run first, in notebook order."""
    if explore.run_first == ["above"]:
        return [i for s in secs[:secs.index(explore)] for i in s.code]
    by_label = {s.label: s for s in secs if s.label}
    missing = [lab for lab in explore.run_first if lab not in by_label]
    if missing:
        raise ValueError(f"'{explore.title}' says to run section(s) {missing} first, "
                         f"but the notebook has no such section (labels: {sorted(by_label)})")
    return sorted(i for lab in explore.run_first for i in by_label[lab].code)


def imported_names(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(_parse(source)):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return names


def used_names(source: str) -> set[str]:
    return {n.id for n in ast.walk(_parse(source)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _parse(source: str) -> ast.AST:
    # IPython magics and shell escapes are not Python: leave them out of the analysis; a cell that
    # writes a file (`%%writefile`) runs none of its code in the kernel.
    if source.lstrip().startswith("%%writefile"):
        return ast.Module(body=[], type_ignores=[])
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(lines))


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)
