"""`make lint` lints the scripts in `%%writefile` cells (scripts/lesson_scripts.py), which ruff
skips in a notebook: a long line there fails the step, named by notebook, cell and line; a clean
cell passes; `--fix` formats a cell in place and changes nothing else in the notebook."""

import importlib.util
import json
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "lesson_scripts", ROOT / "scripts" / "lesson_scripts.py"
)
lesson_scripts = importlib.util.module_from_spec(_spec)
sys.modules["lesson_scripts"] = lesson_scripts  # dataclasses look their module up there
_spec.loader.exec_module(lesson_scripts)

CLEAN = '%%writefile {TRAIN_PY}\n"""A clean script."""\n\nimport os\n\nprint(os.getcwd())'
LONG = f"%%writefile {{TRAIN_PY}}\nimport os\n\nprint(os.getcwd(), {'x' * 98!r})"  # 120 chars


def _notebook(folder: Path, name: str, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A lesson")]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    path = folder / name
    nbformat.write(nb, path)
    return path


def test_a_long_line_fails_named_by_notebook_and_cell_a_clean_cell_passes(tmp_path, capsys):
    assert len(LONG.splitlines()[-1]) == 120
    bad = _notebook(tmp_path, "07_bad.ipynb", "x = 1", CLEAN, LONG)
    assert lesson_scripts.main([str(bad)]) == 1
    out = capsys.readouterr().out
    assert "07_bad.ipynb cell 3 (%%writefile {TRAIN_PY}), line 4:101: E501" in out
    assert "cell 2" not in out  # the clean cell is not blamed
    good = _notebook(tmp_path, "08_good.ipynb", CLEAN, "%%writefile notes.txt\nnot Python at all")
    assert lesson_scripts.main([str(good)]) == 0
    assert "1 %%writefile cells pass" in capsys.readouterr().out


def test_fix_formats_the_cell_in_place_and_nothing_else(tmp_path, capsys):
    messy = "%%writefile {TRAIN_PY}\nimport sys,os\nx=[1,\n  2]\nprint(x, os.sep)"
    path = _notebook(tmp_path, "09_messy.ipynb", "y=2  # an ordinary cell: not this step's", messy)
    before = json.loads(path.read_text())
    assert lesson_scripts.main([str(path)]) == 1
    assert (
        "09_messy.ipynb cell 2 (%%writefile {TRAIN_PY}): not formatted" in capsys.readouterr().out
    )
    assert lesson_scripts.main(["--fix", str(path)]) == 0
    after = json.loads(path.read_text())
    fixed = "%%writefile {TRAIN_PY}\nimport os\n\nx = [1, 2]\nprint(x, os.sep)"
    assert "".join(after["cells"][2]["source"]) == fixed  # unused `sys` removed, formatted
    before["cells"][2]["source"] = after["cells"][2]["source"]
    assert after == before
