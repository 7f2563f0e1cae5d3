"""Notebook code for tests to run: the scripts notebooks write with `%%writefile {NAME}`, and a
code cell found by a line it holds."""

from __future__ import annotations

from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def write_script(notebook: str, name: str, dest: Path) -> Path:
    """Write the body of `notebook`'s `%%writefile {name}` cell to `dest`; return `dest`."""
    for cell in nbformat.read(NOTEBOOKS / notebook, as_version=4).cells:
        first, _, body = cell.source.partition("\n")
        if cell.cell_type == "code" and first.split() == ["%%writefile", f"{{{name}}}"]:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(body + "\n")
            return dest
    raise LookupError(f"{notebook} has no cell starting with %%writefile {{{name}}}")


def code_cell(notebook: str, marker: str) -> str:
    """The source of `notebook`'s one code cell that contains `marker`."""
    cells = nbformat.read(NOTEBOOKS / notebook, as_version=4).cells
    found = [c.source for c in cells if c.cell_type == "code" and marker in c.source]
    if len(found) != 1:
        raise LookupError(f"{notebook}: {len(found)} code cells contain {marker!r}, expected one")
    return found[0]
