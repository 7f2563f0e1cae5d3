"""Notebook code for tests to run: the scripts notebooks write with `%%writefile {NAME}`, and a
code cell found by a line it holds. scripts/lesson_scripts.py lints those scripts from here too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@dataclass(frozen=True)
class WritefileCell:
    """A `%%writefile [-a] TARGET` cell: IPython expands `{NAME}` in the magic's line only, so
    `body`, everything after that line, is the file as written, byte for byte."""

    index: int  # the cell's position among all the notebook's cells, as JupyterLab counts them
    magic: str  # its first line, e.g. "%%writefile {TRAIN_PY}"
    target: str  # the path as typed, e.g. "{TRAIN_PY}": a placeholder the kernel fills in
    body: str

    @property
    def is_python(self) -> bool:
        """A `.py` file, or a `{NAME}` placeholder (the notebooks name their scripts that way;
        its value is only known to the kernel)."""
        return self.target.endswith(".py") or self.target.startswith(("{", "$"))


def writefile_cells(notebook: Path) -> list[WritefileCell]:
    """Every `%%writefile` code cell of `notebook`, in order."""
    found = []
    for index, cell in enumerate(json.loads(notebook.read_text(encoding="utf-8"))["cells"]):
        source = "".join(cell["source"])
        magic, _, body = source.partition("\n")
        words = magic.split()
        if cell["cell_type"] == "code" and len(words) >= 2 and words[0] == "%%writefile":
            found.append(WritefileCell(index, magic, words[-1], body))
    return found


def write_script(notebook: str, name: str, dest: Path) -> Path:
    """Write the body of `notebook`'s `%%writefile {name}` cell to `dest`; return `dest`."""
    for cell in writefile_cells(NOTEBOOKS / notebook):
        if cell.magic.split() == ["%%writefile", f"{{{name}}}"]:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(cell.body + "\n")
            return dest
    raise LookupError(f"{notebook} has no cell starting with %%writefile {{{name}}}")


def code_cell(notebook: str, marker: str) -> str:
    """The source of `notebook`'s one code cell that contains `marker`."""
    cells = nbformat.read(NOTEBOOKS / notebook, as_version=4).cells
    found = [c.source for c in cells if c.cell_type == "code" and marker in c.source]
    if len(found) != 1:
        raise LookupError(f"{notebook}: {len(found)} code cells contain {marker!r}, expected one")
    return found[0]
