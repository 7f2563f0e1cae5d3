"""The first cell of every notebook: makes the notebook runnable where the suite is not installed.

In a clone of the suite it does nothing (the helpers import already). On Colab, Kaggle or any
Jupyter that has PyTorch but not the suite, it installs the suite's helpers from the project's
repository (`[project.urls] Repository` in pyproject.toml), at the version the notebook belongs
to, and their small dependencies; it never installs or upgrades torch or torchvision, because a
hosted notebook's torch is built for its GPU and replacing it breaks the runtime. The data sets
are fetched by the notebook's own cells (torchvision download, or the synthetic stand-in offline).
`FTG_SOURCE=<path or pip URL>` installs from there instead (a test points it at a local clone).

    python -m helpers.suite.setup_cell     # write the cell into every notebook (tests check it is there)
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import nbformat

from .. import paths

MARKER = "# Setup for Colab, Kaggle"

TEMPLATE = '''# Setup for Colab, Kaggle or any Jupyter without this suite: installs its helpers, never torch.
# In a clone of the suite this cell does nothing.
import importlib.metadata as md, importlib.util, os, re, subprocess, sys  # noqa: E401
from pathlib import Path

REPOSITORY = "{repository}"  # [project.urls] in pyproject.toml
VERSION = "{version}"  # the suite's version this notebook belongs to
if importlib.util.find_spec("helpers") is None:
    if Path("../helpers/__init__.py").is_file():  # a clone whose helpers are not installed
        sys.path.insert(0, str(Path("..").resolve()))
    else:
        source = os.environ.get("FTG_SOURCE") or f"git+{{REPOSITORY}}@v{{VERSION}}"
        pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--no-deps", source], check=True)  # the helpers alone
        # Only what is missing: the hosted torch is built for its GPU and its Jupyter packages
        # are the service's own; replacing either breaks the runtime.
        missing, older = [], []
        for req in md.requires("feed-the-gpu") or []:
            name, low = re.match(r"([\\w.-]+)\\s*(?:>=\\s*([\\w.]+))?", req).groups()
            if "extra ==" in req:
                continue
            try:
                have = md.version(name)
            except md.PackageNotFoundError:
                missing.append(req)
                continue
            if low and [int(x) for x in re.findall(r"\\d+", have)[:3]] < [int(x) for x in low.split(".")]:
                older.append(f"{{name}} {{have}} (tested from {{low}})")
        if missing:
            subprocess.run([*pip, *missing], check=True)
        print("Installed the suite's helpers from", source)
        if older:
            print("Kept this machine's older", ", ".join(older), "- if something fails, that may be why")
'''


def project() -> dict:
    return tomllib.loads((paths.ROOT / "pyproject.toml").read_text())["project"]


def source() -> str:
    """The setup cell's code, with the repository and version from pyproject.toml."""
    p = project()
    return TEMPLATE.format(repository=p["urls"]["Repository"], version=p["version"])


def badges(notebook: str) -> str:
    """Markdown: open `notebook` (a file name in notebooks/) in Colab or Kaggle."""
    if not isinstance(notebook, str) or not notebook.endswith(".ipynb"):
        raise ValueError(f"badges: notebook must be a .ipynb file name, got {notebook!r}")
    repo = project()["urls"]["Repository"].removeprefix("https://github.com/")
    path = f"github/{repo}/blob/main/notebooks/{notebook}"
    return (f"[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"(https://colab.research.google.com/{path}) "
            f"[![Open in Kaggle](https://kaggle.com/static/images/open-in-kaggle.svg)]"
            f"(https://kaggle.com/kernels/welcome?src=https://github.com/{repo}/blob/main/notebooks/{notebook})")


def apply(nb_path: Path) -> bool:
    """Put the setup cell first and the badges under the title of `nb_path`; True if it changed."""
    nb = nbformat.read(nb_path, as_version=4)
    before = nbformat.writes(nb)
    code = source()
    if nb.cells and nb.cells[0].cell_type == "code" and nb.cells[0].source.startswith(MARKER):
        nb.cells[0].source = code
    else:
        cell = nbformat.v4.new_code_cell(code)
        cell.id = "ftg-setup"
        nb.cells.insert(0, cell)
    header = next(c for c in nb.cells if c.cell_type == "markdown")
    lines = [ln for ln in header.source.splitlines() if "Open in Colab" not in ln]
    lines.insert(1, "\n" + badges(nb_path.name))
    header.source = "\n".join(lines).replace("\n\n\n", "\n\n")
    changed = nbformat.writes(nb) != before
    if changed:
        nbformat.write(nb, nb_path)
    return changed


def main() -> int:
    for nb_path in sorted((paths.ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        print(("updated " if apply(nb_path) else "unchanged ") + nb_path.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
