"""The README's code-size table is what scripts/code_size.py measures now (a figure kept true)."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("code_size", ROOT / "scripts" / "code_size.py")
code_size = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(code_size)


def test_readme_reports_the_code_size_of_this_checkout():
    assert code_size.readme_table() == code_size.table(), (
        "README.md's code-size table is stale: run `python scripts/code_size.py --write`"
    )


def test_the_table_counts_what_is_there(tmp_path, monkeypatch):
    pkg = tmp_path / "helpers"
    for sub in ("", "suite", "doctor"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
    (pkg / "a.py").write_text("x = 1\n" * 140)
    (pkg / "__init__.py").write_text("y = 2\n" * 999)  # not counted: a package's map, not code
    (tmp_path / "notebooks").mkdir()
    cell = {"cell_type": "code", "source": ["a = 1\n"] * 23}
    text = {"cell_type": "markdown", "source": ["# A title\n", "three more words"]}
    (tmp_path / "notebooks" / "n.ipynb").write_text(json.dumps({"cells": [text, cell]}))
    monkeypatch.setattr(code_size, "ROOT", tmp_path)
    rows = code_size.table().splitlines()
    assert rows[2] == "| `helpers/` | 1 | 100 | the toolkit the notebooks import |"
    assert "| notebook code cells | 1 cells | 0 | the longest at most 30 lines |" == rows[-2]
    assert rows[-1] == (
        "| notebook markdown | 1 notebooks | 0 words | the longest unit at most 100 words |"
    )
    assert code_size.unit_sizes() == [
        {"notebook": "n", "code cells": 1, "code lines": 23, "markdown words": 6}
    ]
    assert code_size.unit_table().splitlines()[-1] == "| n | 1 | 23 | 6 |"
