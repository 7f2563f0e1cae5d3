"""The setup cell of every notebook (after its title): makes the notebook runnable where the
suite is not installed, and the Colab/Kaggle badges under the title.

In a clone of the suite it does nothing (the helpers import already; a clone whose helpers are not
installed puts its own folder on the path). On Colab, Kaggle or any Jupyter that has PyTorch but
not the suite, pip installs the helpers alone, at the version the notebook belongs to, from the
project's repository (`[project.urls] Repository` in pyproject.toml); then `install_missing`
installs only the dependencies the machine lacks. It never installs or upgrades torch or the
Jupyter packages: a hosted torch is built for its GPU, and replacing either breaks the runtime.
`FTG_SOURCE=<path or pip URL>` installs from there instead (a test points it at a local clone).

    python -m helpers.suite.setup_cell && nbstripout notebooks/*.ipynb   # every notebook (tests check)

This module imports only the standard library at the top: `install_missing` runs right after
pip installed the helpers without their dependencies.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from .. import paths

TEMPLATE = '''import importlib.util, os, sys  # noqa: E401
sys.path += [os.path.abspath("..")] if os.path.isfile("../helpers/__init__.py") and not importlib.util.find_spec("helpers") else []  # a clone
if importlib.util.find_spec("helpers") is None:  # Colab, Kaggle, a Jupyter without the suite: install its helpers, never torch
    %pip install -q --no-deps {{os.environ.get("FTG_SOURCE") or "git+{repository}@v{version}"}}
    import helpers.suite.setup_cell as s; s.install_missing()  # what they need and this machine lacks'''


def _release(version: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", version)[:3]]


def install_missing(dist: str = "feed-the-gpu") -> list[str]:
    """pip-install the requirements of `dist` that are not installed at all; keep those that are,
    even when older than the tested lower bound (said so). Returns what it installed."""
    missing, older = [], []
    for req in md.requires(dist) or []:
        if "extra ==" in req:
            continue
        name, low = re.match(r"([\w.-]+)\s*(?:>=\s*([\w.]+))?", req).groups()
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            missing.append(req.split(";")[0].strip())
            continue
        if low and _release(have) < _release(low):
            older.append(f"{name} {have} (tested from {low})")
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *missing], check=True)
    print(f"Installed the suite's helpers ({dist} {md.version(dist)})"
          + (f" and {', '.join(missing)}" if missing else ""))
    if older:
        print("Kept this machine's older", ", ".join(older), "- if something fails, that may be why")
    return missing


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


def _is_setup(cell: dict) -> bool:
    return cell.cell_type == "code" and any(m in cell.source for m in ('find_spec("helpers")', "# Setup for Colab"))


def apply(nb_path: Path) -> bool:
    """Put the badges under the title of `nb_path` and the setup cell right after the title
    cell; True if the notebook changed."""
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    before = nbformat.writes(nb)
    cell = next((c for c in nb.cells if _is_setup(c)), None) or nbformat.v4.new_code_cell()
    nb.cells = [c for c in nb.cells if not _is_setup(c)]
    title = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown")
    header = nb.cells[title]
    lines = [ln for ln in header.source.splitlines() if "Open in Colab" not in ln]
    lines.insert(1, "\n" + badges(nb_path.name))
    header.source = "\n".join(lines).replace("\n\n\n", "\n\n")
    cell.source = source()
    nb.cells.insert(title + 1, cell)
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
