"""The scripts notebooks write with `%%writefile {NAME}`: the same text, for tests to run."""

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
