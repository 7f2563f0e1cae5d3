"""Colab / Kaggle: the setup cell, the badges, and a notebook run the way a hosted service runs it.

The hosted run: a fresh virtual environment that has torch, torchvision and the Jupyter kernel
(and what they depend on) but not the project's environment; the notebook copied alone into an
empty folder; its setup cell installing the helpers from a copy of this clone (`FTG_SOURCE`)
instead of the network. To stay fast the fresh environment does not reinstall torch (gigabytes):
it sees exactly the closure of torch + torchvision + ipykernel through symlinks to the installed
packages, listed in a `.pth` file, and nothing else; whatever else the notebook needs must come
from the setup cell (which pip installs into the fresh environment from the package index).
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement

from helpers import paths
from helpers.suite import runner, setup_cell
from tests import notebook_sections as ns

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_every_notebook_has_the_setup_cell_after_its_title_and_badges():
    code = setup_cell.source()
    assert len(code.splitlines()) <= 10  # a few lines: formatted, it reads as plain Python
    for nb_path in NOTEBOOKS:
        nb = nbformat.read(nb_path, as_version=4)
        title, setup = nb.cells[0], nb.cells[1]
        assert title.cell_type == "markdown" and title.source.startswith("# "), (
            f"{nb_path.name}: no title first"
        )
        assert "what you will learn" in title.source.lower(), (
            f"{nb_path.name}: the title says what you will learn"
        )
        assert setup.cell_type == "code" and setup.source == code, (
            f"{nb_path.name}: the cell after the title is not the setup cell "
            "(run `python -m helpers.suite.setup_cell`)"
        )
        assert sum(code in c.source for c in nb.cells) == 1, f"{nb_path.name}: one setup cell"
        assert setup_cell.badges(nb_path.name) in title.source, (
            f"{nb_path.name}: no Colab/Kaggle badges"
        )


@pytest.mark.parametrize("site", [True, False], ids=["helpers-installed", "not-installed"])
def test_setup_cell_in_a_clone_installs_nothing_and_finds_the_clones_helpers(site):
    """Run as IPython runs it, in notebooks/ of this checkout, with the helpers installed or not
    (`-S`: no site-packages): no pip (it would need IPython), the clone's own helpers import."""
    from IPython.core.inputtransformer2 import TransformerManager

    code = TransformerManager().transform_cell(setup_cell.source())
    assert "run_line_magic('pip'" in code  # the hosted branch is there, and not taken below
    check = "import helpers; print(helpers.__file__)"
    run = subprocess.run(
        [
            sys.executable,
            *([] if site else ["-S"]),
            "-c",
            f"import os; os.chdir({str(ROOT / 'notebooks')!r})\n{code}\n{check}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(ROOT / "helpers" / "__init__.py"), run.stdout


def test_install_missing_installs_only_what_is_missing(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(
        setup_cell.md,
        "requires",
        lambda d: ["torch>=99.0", "no-such-package-ftg>=1.0", "pytest; extra == 'dev'"],
    )
    monkeypatch.setattr(
        setup_cell.md,
        "version",
        lambda d: (
            "2.11.0"
            if d == "torch"
            else (
                "0.2.0"
                if d == "feed-the-gpu"
                else (_ for _ in ()).throw(md.PackageNotFoundError(d))
            )
        ),
    )
    monkeypatch.setattr(setup_cell.subprocess, "run", lambda cmd, check: calls.append(cmd))
    assert setup_cell.install_missing() == ["no-such-package-ftg>=1.0"]
    assert (
        len(calls) == 1
        and calls[0][-1] == "no-such-package-ftg>=1.0"
        and "torch" not in " ".join(calls[0])
    )
    out = capsys.readouterr().out
    assert "Installed the suite's helpers (feed-the-gpu 0.2.0) and no-such-package-ftg>=1.0" in out
    # an older torch is kept (importing helpers names it: test_environment checks that line)


def test_setup_cell_reads_the_one_repository_url_and_version():
    repo = PYPROJECT["urls"]["Repository"]
    assert repo.startswith("https://github.com/")
    code = setup_cell.source()
    assert f'"git+{repo}@v{PYPROJECT["version"]}"' in code and "--no-deps" in code
    import helpers

    assert helpers.__version__ == PYPROJECT["version"]
    readme = (ROOT / "README.md").read_text()
    assert "colab-badge.svg" in readme and "open-in-kaggle.svg" in readme
    assert repo.removeprefix("https://github.com/") in readme
    where = readme.split("## Where to run it", 1)[1].split("\n## ", 1)[0]
    for place in (
        "Linux + NVIDIA GPU",
        "Mac with Apple silicon (MPS)",
        "Google Colab",
        "Kaggle",
        "CPU only",
        "Windows",
    ):
        assert f"| {place}" in where, f"README's 'Where to run it' table lacks {place}"
    for nb_path in NOTEBOOKS:
        assert setup_cell.badges(nb_path.name) in readme, (
            f"README lacks the badges of {nb_path.name}"
        )


def test_installed_helpers_write_data_and_results_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("FTG_DATA_DIR", raising=False)
    monkeypatch.delenv("FTG_BUILD_DIR", raising=False)
    monkeypatch.setattr(paths, "ROOT", tmp_path / "site-packages")  # no pyproject, no notebooks/
    monkeypatch.chdir(tmp_path)
    assert not paths.in_checkout()
    assert paths.data_dir() == tmp_path / "data" and paths.build_dir() == tmp_path / "build"
    monkeypatch.setattr(paths, "ROOT", ROOT)
    assert paths.in_checkout() and paths.data_dir() == ROOT / "data"


def _closure(names: list[str]) -> set[str]:
    """The installed distributions `names` need, recursively (extras not included)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        dist = md.distribution(name)
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _overlay(dists: set[str], dest: Path) -> None:
    """Symlink the top-level files and folders of each distribution into `dest`."""
    dest.mkdir()
    for name in dists:
        dist = md.distribution(name)
        base = Path(dist.locate_file(""))
        for f in dist.files or []:
            top = f.parts[0]
            if top == ".." or top.endswith(".pth") or top == "__pycache__":
                continue
            link = dest / top
            if not link.exists():
                link.symlink_to(base / top)


@pytest.fixture(scope="module")
def hosted_python(tmp_path_factory) -> Path:
    """A fresh venv that sees only torch, torchvision, ipykernel and their dependencies."""
    root = tmp_path_factory.mktemp("hosted")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    py = root / "venv" / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    dists = _closure(["torch", "torchvision", "ipykernel"])
    assert "feed-the-gpu" not in dists and "pandas" not in dists
    _overlay(dists, root / "preinstalled")
    (site / "preinstalled.pth").write_text(str(root / "preinstalled") + "\n")
    # the clone, as git has it (a copy: pip builds in the source folder)
    clone = root / "clone"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (clone / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, clone / f)
    kernels = root / "jupyter" / "kernels" / "hosted"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [str(py), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "hosted",
                "language": "python",
            }
        )
    )
    return root


def _run_hosted(hosted_python: Path, work: Path, nb: nbformat.NotebookNode) -> set[str]:
    """Execute `nb` in the fresh environment with `work` as its folder, as Colab would (the
    packages an earlier run installed uninstalled first); the packages this run installed."""
    venv = hosted_python / "venv"
    if (venv / "installed").exists():  # each run gets the bare environment again
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "uninstall",
                "-q",
                "-y",
                *(venv / "installed").read_text().split(),
            ],
            check=True,
        )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "FTG_DATA_DIR", "FTG_BUILD_DIR", "VIRTUAL_ENV")
    }
    env |= {
        "FTG_SOURCE": str(hosted_python / "clone"),
        "FTG_PROFILE": "smoke",
        "FTG_OFFLINE": "1",
        "JUPYTER_PATH": str(hosted_python / "jupyter"),
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    }
    before = _pip_list(venv)
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        runner.headless_client(
            nb, kernel_name="hosted", timeout=600, resources={"metadata": {"path": str(work)}}
        ).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
        (venv / "installed").write_text(" ".join(_pip_list(venv) - before))
    setup_out = "".join(o.get("text", "") for o in nb.cells[1].outputs)
    assert "Installed the suite's helpers (feed-the-gpu" in setup_out, setup_out
    installed = _pip_list(venv) - before
    assert "feed-the-gpu" in installed
    assert not {"torch", "torchvision"} & installed, "the setup cell touched torch"
    return installed


# Two notebooks run whole from an empty folder (the first unit, and one with data, frameworks and
# widgets); every notebook's imports run below, so what the setup cell installs is checked for all
# 21 without executing each one again (the capstone alone took 2-3 minutes of CI here).
@pytest.mark.learner
@pytest.mark.xdist_group("hosted")  # one worker builds the fresh environment, once
@pytest.mark.timeout(1200)  # a hang guard: a lost kernel reply must fail the test, not stall CI
@pytest.mark.parametrize("name", ["00_your_machine_and_timing", "07_batch_size_and_accumulation"])
def test_notebook_runs_from_an_empty_folder_with_only_the_setup_cell(hosted_python, tmp_path, name):
    work = tmp_path / "content"  # Colab's working directory, empty but for the notebook
    work.mkdir()
    shutil.copy2(ROOT / "notebooks" / f"{name}.ipynb", work)
    _run_hosted(hosted_python, work, nbformat.read(work / f"{name}.ipynb", as_version=4))
    assert (work / "build").is_dir(), "results should land in the working directory"
    site = (
        hosted_python
        / "venv"
        / "lib"
        / f"python{sys.version_info.major}.{sys.version_info.minor}"
        / "site-packages"
    )
    assert not (site / "data").exists() and not (site / "build").exists()


def _top(node: ast.Import | ast.ImportFrom) -> str:
    """The top-level package an import statement reads."""
    name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
    return (name or "").split(".")[0]


def notebook_imports(path: Path) -> str:
    """A notebook's top-level import statements (not those inside a `try`: optional packages such
    as Lightning are imported where the notebook checks for them), in cell order."""
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    # modules the notebook writes itself (`%%writefile {PATH}` of a `name.py`)
    written = {m for c in cells for m in re.findall(r"(\w+)\.py\b", c.source)}
    lines = []
    for cell in cells:
        src = cell.source
        if src.lstrip().startswith("%%"):
            continue
        src = ns.python_source(src)
        tree = ast.parse(src)
        lines += [
            ast.get_source_segment(src, n)
            for n in tree.body
            if isinstance(n, (ast.Import, ast.ImportFrom)) and not {_top(n)} & written
        ]
    return "\n".join(lines)


def test_notebook_imports_are_its_top_level_import_statements(tmp_path):
    cells = [
        nbformat.v4.new_code_cell("%matplotlib inline\nimport os\nfrom helpers import data"),
        nbformat.v4.new_code_cell("try:\n    import lightning\nexcept ImportError:\n    pass"),
        nbformat.v4.new_code_cell('%%writefile {FOLDER / "lesson.py"}\nimport never'),
        nbformat.v4.new_code_cell("import lesson"),
        nbformat.v4.new_code_cell("x = 1\nimport pandas as pd"),
    ]
    path = tmp_path / "n.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    assert notebook_imports(path) == "import os\nfrom helpers import data\nimport pandas as pd"


@pytest.mark.learner
@pytest.mark.xdist_group("hosted")
@pytest.mark.timeout(600)
def test_every_notebooks_imports_resolve_after_only_the_setup_cell(hosted_python, tmp_path):
    """The setup cell in an empty folder, then each notebook's imports, in one hosted kernel."""
    work = tmp_path / "content"
    work.mkdir()
    setup = nbformat.read(NOTEBOOKS[0], as_version=4).cells[:2]  # the title and the setup cell
    cells = [nbformat.v4.new_code_cell(notebook_imports(p)) for p in NOTEBOOKS]
    nb = nbformat.v4.new_notebook(cells=[*setup, *cells])
    _run_hosted(hosted_python, work, nb)
    assert all(c.execution_count for c in nb.cells[2:]), "a notebook's imports did not run"


def _pip_list(venv: Path) -> set[str]:
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "list",
            "--path",
            str(
                venv
                / "lib"
                / f"python{sys.version_info.major}.{sys.version_info.minor}"
                / "site-packages"
            ),
            "--format=freeze",
            "--disable-pip-version-check",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {ln.split("==")[0].lower() for ln in out.splitlines() if "==" in ln}
