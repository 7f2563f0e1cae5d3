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
            if (
                m
                and (len(m.group(1)) == 2 or "explore" in m.group(2).lower())
                and m.group(2).strip().lower() != "parameters"
            ):
                title = m.group(2).strip()
                label = LABEL.match(title)
                out.append(
                    Section(title, label.group(1) if label else None, "explore" in title.lower())
                )
            if out:
                first = RUN_FIRST.search(cell.source)
                if first:
                    text = (
                        first.group(1).split("(")[0]
                        if "above" in first.group(1)
                        else first.group(1)
                    )
                    out[-1].run_first = ["above"] if "above" in text else _labels(text)
        elif cell.cell_type == "code":
            (out[-1].code if out else setup).append(i)
    return setup, out


def _labels(text: str) -> list[str]:
    labels: list[str] = []
    for a, b, letter in re.findall(r"(\d+)\s*(?:[-–]|to)\s*(\d+)|(\([a-z]\)|\d+)", text):
        labels += [str(n) for n in range(int(a), int(b) + 1)] if a else [letter]
    return labels


def prerequisites(secs: list[Section], explore: Section) -> list[int]:
    """Code cells of the sections an Explore section says to run first, in notebook order."""
    if explore.run_first == ["above"]:
        return [i for s in secs[: secs.index(explore)] for i in s.code]
    by_label = {s.label: s for s in secs if s.label}
    missing = [lab for lab in explore.run_first if lab not in by_label]
    if missing:
        raise ValueError(
            f"'{explore.title}' says to run section(s) {missing} first, "
            f"but the notebook has no such section (labels: {sorted(by_label)})"
        )
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
    return {
        n.id
        for n in ast.walk(_parse(source))
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }


def python_source(source: str) -> str:
    """A cell as Python: each IPython magic or shell line becomes `pass` at its indent, so an
    indented `%pip` keeps its block and every line keeps its number."""
    return "\n".join(
        ln[: len(ln) - len(ln.lstrip())] + "pass" if ln.lstrip().startswith(("%", "!")) else ln
        for ln in source.splitlines()
    )


def _parse(source: str) -> ast.AST:
    # a cell that writes a file (`%%writefile`) runs none of its code in the kernel
    if source.lstrip().startswith("%%writefile"):
        return ast.Module(body=[], type_ignores=[])
    return ast.parse(python_source(source))


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def explore_callbacks(source: str) -> dict[str, set[str]]:
    """The functions a cell defines and hands to `interact()`, each with the global names its body
    reads: the values it computes with whenever a control moves, long after the cell ran."""
    tree = _parse(source)
    defined = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    handed = {
        call.args[0].id
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and call.args
        and isinstance(call.args[0], ast.Name)
        and (getattr(call.func, "id", None) or getattr(call.func, "attr", None)) == "interact"
    }
    reads = {}
    for name in sorted(handed & defined.keys()):
        fn = defined[name]
        body = ast.Module(
            body=fn.body, type_ignores=[]
        )  # defaults were evaluated when it was defined
        params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        nodes = [n for n in ast.walk(body) if isinstance(n, ast.Name)]
        local = params | {n.id for n in nodes if isinstance(n.ctx, ast.Store)}
        reads[name] = {n.id for n in nodes if isinstance(n.ctx, ast.Load)} - local
    return reads


def bound_names(source: str) -> set[str]:
    """The global names a cell rebinds to a new value: assignments, loops and definitions (an
    import binds the same module again)."""
    names: set[str] = set()
    scopes = (
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.Lambda,
        ast.ClassDef,
        ast.ListComp,
        ast.SetComp,
        ast.DictComp,
        ast.GeneratorExp,
    )

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(child.name)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                names.add(child.id)
            if not isinstance(child, scopes):
                visit(child)

    visit(_parse(source))
    return names


def all_bound_names(source: str) -> set[str]:
    """Every name a cell binds at any depth (assignments, arguments, definitions, imports,
    `except ... as`): a name read but bound nowhere in the cells run must come from elsewhere."""
    tree = _parse(source)
    names = imported_names(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names
