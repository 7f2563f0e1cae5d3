"""The setup cell after every notebook's title, and the Colab/Kaggle badges under the title.

In a clone the cell at most puts the clone on the path. Elsewhere pip installs the helpers
alone, at the notebook's version (`[project.urls]` in pyproject.toml, or `FTG_SOURCE` for tests),
then `install_missing` adds what the machine lacks, never torch or Jupyter (the service's own,
built for its GPU). Only the standard library at the top: this runs right after that pip.

    # every notebook (tests check)
    python -m helpers.suite.setup_cell && nbstripout notebooks/*.ipynb
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from .. import paths

TEMPLATE = """import importlib.util, os, sys  # noqa: E401

if os.path.isfile("../helpers/__init__.py") and not importlib.util.find_spec("helpers"):
    sys.path.append(os.path.abspath(".."))  # a clone: its helpers are one folder up
if importlib.util.find_spec("helpers") is None:  # Colab, Kaggle: install the helpers, never torch
    src = os.environ.get("FTG_SOURCE") or "git+{repository}@v{version}"
    %pip install -q --no-deps {{src}}
    from helpers.suite.setup_cell import install_missing

    install_missing()  # what this machine lacks, never torch or Jupyter"""


def install_missing(dist: str = "feed-the-gpu") -> list[str]:
    """pip-install the requirements of `dist` that are missing, and return them; an older version
    stays (importing `helpers` names those below the tested lower bound)."""
    missing = []
    for req in (Requirement(r) for r in md.requires(dist) or []):
        if req.marker is not None:  # an extra's (d2l, dev, report): not the notebooks' needs
            continue
        try:
            md.version(req.name)
        except md.PackageNotFoundError:
            missing.append(str(req))
    if missing:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *missing],
            check=True,
        )
    print(
        f"Installed the suite's helpers ({dist} {md.version(dist)})"
        + (f" and {', '.join(missing)}" if missing else "")
    )
    return missing


def project() -> dict:
    return tomllib.loads((paths.ROOT / "pyproject.toml").read_text())["project"]


def source() -> str:
    """The setup cell's code, with the repository and version from pyproject.toml."""
    return TEMPLATE.format(repository=project()["urls"]["Repository"], version=project()["version"])


def badges(notebook: str) -> str:
    """Markdown: open `notebook` (a file name in notebooks/) in Colab or Kaggle."""
    if not isinstance(notebook, str) or not notebook.endswith(".ipynb"):
        raise ValueError(f"badges: notebook must be a .ipynb file name, got {notebook!r}")
    path = (
        project()["urls"]["Repository"].removeprefix("https://")
        + f"/blob/main/notebooks/{notebook}"
    )
    return (
        f"[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"(https://colab.research.google.com/{path.replace('github.com', 'github', 1)}) "
        f"[![Open in Kaggle](https://kaggle.com/static/images/open-in-kaggle.svg)]"
        f"(https://kaggle.com/kernels/welcome?src=https://{path})"
    )


def _is_setup(cell: dict) -> bool:
    return cell.cell_type == "code" and any(
        m in cell.source for m in ('find_spec("helpers")', "# Setup for Colab")
    )


def apply(nb_path: Path) -> bool:
    """The badges under the title of `nb_path`, the setup cell after it; True if that changed it."""
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    before = nbformat.writes(nb)
    cell = next((c for c in nb.cells if _is_setup(c)), None) or nbformat.v4.new_code_cell()
    nb.cells = [c for c in nb.cells if not _is_setup(c)]
    title = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown")
    lines = [ln for ln in nb.cells[title].source.splitlines() if "Open in Colab" not in ln]
    nb.cells[title].source = "\n".join([lines[0], "\n" + badges(nb_path.name), *lines[1:]]).replace(
        "\n\n\n", "\n\n"
    )
    cell.source = source()
    nb.cells.insert(title + 1, cell)
    if changed := nbformat.writes(nb) != before:
        nbformat.write(nb, nb_path)
    return changed


def main() -> int:
    for nb_path in sorted((paths.ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")):
        print(("updated " if apply(nb_path) else "unchanged ") + nb_path.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
