"""The scripts learners copy (every notebook's `%%writefile` cells: the DDP, FSDP and pipeline
code), linted with the project's ruff settings. Ruff lints a notebook's ordinary cells but skips
a cell that starts with a cell magic, so without this step those scripts are never checked.

    python scripts/lesson_scripts.py              # ruff format --check and ruff check (make lint)
    python scripts/lesson_scripts.py --fix        # ruff check --fix and ruff format, into the cells
    python scripts/lesson_scripts.py NB.ipynb ... # those notebooks only

Each cell's body goes to its own file in a temporary folder, named after its notebook and cell
(`16_ddp.cell04.TRAIN_PY.py`); problems are printed with the notebook, the cell's index and the
line in the cell (the `%%writefile` line is line 1). Exit status 1 on any problem.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"  # line-length 100 and the selected rules, as for all code
sys.path.insert(0, str(ROOT))
from tests.notebook_scripts import WritefileCell, writefile_cells  # noqa: E402


@dataclass(frozen=True)
class Script:
    """One cell's body, written out to `path` for ruff."""

    notebook: Path
    cell: WritefileCell
    path: Path

    @property
    def label(self) -> str:
        where = self.notebook.resolve()
        shown = where.relative_to(ROOT) if where.is_relative_to(ROOT) else self.notebook
        return f"{shown} cell {self.cell.index} ({self.cell.magic})"


def extract(notebooks: list[Path], folder: Path) -> list[Script]:
    """Write the body of every Python `%%writefile` cell of `notebooks` into `folder`."""
    scripts = []
    for nb in notebooks:
        for cell in writefile_cells(nb):
            if not cell.is_python:
                continue
            name = re.sub(r"\W+", "_", cell.target).strip("_") or "script"
            path = folder / f"{nb.stem}.cell{cell.index:02d}.{name}.py"
            path.write_text(cell.body + "\n", encoding="utf-8")
            scripts.append(Script(nb, cell, path))
    return scripts


def _ruff(args: list[str], scripts: list[Script]) -> subprocess.CompletedProcess:
    """ruff with the repository's configuration; run from the root, where `src` (first-party
    imports such as `helpers`) resolves as it does for the rest of the code."""
    files = [str(s.path) for s in scripts]
    command = [sys.executable, "-m", "ruff", *args, "--config", str(PYPROJECT), *files]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True)


def format_problems(scripts: list[Script], show_diff: bool = False) -> list[str]:
    """Each script ruff's formatter would change: it formats a copy, compared with the cell
    (with `show_diff`, the difference is printed, numbered as the cell's lines are)."""
    copies = [replace(s, path=s.path.with_suffix(".formatted.py")) for s in scripts]
    for s, copy in zip(scripts, copies, strict=True):
        copy.path.write_text(s.path.read_text(encoding="utf-8"), encoding="utf-8")
    _ruff(["format", "--quiet"], copies)
    problems = []
    for s, copy in zip(scripts, copies, strict=True):
        now, formatted = (x.path.read_text(encoding="utf-8") for x in (s, copy))
        copy.path.unlink()
        if now == formatted:
            continue
        problems.append(f"{s.label}: not formatted as ruff formats it")
        if show_diff:
            lines = [f"{s.cell.magic}\n{text}".splitlines(True) for text in (now, formatted)]
            print("".join(difflib.unified_diff(*lines, s.label, "ruff format")))
    return problems


def check_problems(scripts: list[Script]) -> list[str]:
    """ruff check's findings, each at its notebook, cell and line within the cell."""
    done = _ruff(["check", "--output-format", "json"], scripts)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"ruff check failed: {done.stderr.strip()}")
    by_path = {str(s.path): s for s in scripts}
    problems = []
    for finding in json.loads(done.stdout or "[]"):
        where = by_path[finding["filename"]]
        row, column = finding["location"]["row"] + 1, finding["location"]["column"]
        code = finding["code"] or "syntax"
        problems.append(f"{where.label}, line {row}:{column}: {code} {finding['message']}")
    return problems


def write_back(scripts: list[Script]) -> list[Script]:
    """Put each script's file, as ruff left it, back into its cell; the notebook's JSON is
    written as nbformat writes it (indent 1, sorted keys), so only that cell's lines change."""
    changed = [s for s in scripts if s.path.read_text(encoding="utf-8") != s.cell.body + "\n"]
    for nb in dict.fromkeys(s.notebook for s in changed):
        data = json.loads(nb.read_text(encoding="utf-8"))
        for s in (s for s in changed if s.notebook == nb):
            body = s.path.read_text(encoding="utf-8").removesuffix("\n")
            data["cells"][s.cell.index]["source"] = f"{s.cell.magic}\n{body}".splitlines(True)
        text = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
        nb.write_text(text, encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--fix", action="store_true", help="fix and format, into the cells")
    parser.add_argument("--diff", action="store_true", help="show what formatting would change")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    with tempfile.TemporaryDirectory(prefix="lesson-scripts-") as folder:
        scripts = extract(notebooks, Path(folder))
        if not scripts:
            print("lesson scripts: no %%writefile cells to lint")
            return 0
        if args.fix:
            _ruff(["check", "--fix", "--quiet"], scripts)
            _ruff(["format", "--quiet"], scripts)
            for s in write_back(scripts):
                print(f"fixed: {s.label}")
            scripts = extract(notebooks, Path(folder))
        problems = format_problems(scripts, args.diff) + check_problems(scripts)
    for problem in problems:
        print(problem)
    if problems:
        hint = "" if args.fix else "; `python scripts/lesson_scripts.py --fix` formats the cells"
        print(f"lesson scripts: {len(problems)} problem(s) in %%writefile cells{hint}")
        return 1
    print(f"lesson scripts: {len(scripts)} %%writefile cells pass ruff format and ruff check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
