"""How large the code and the units are, as the README reports it: figures for a reader, not
quotas (no test caps a notebook's cells or words; a unit that grows past a sitting is split).

    python scripts/code_size.py              # print the table
    python scripts/code_size.py --write      # put it into README.md, between its markers
    python scripts/code_size.py --notebooks  # each notebook's cells, code lines and words

Lines are rounded to the nearest hundred and the longest code cell up to the next ten, so the
README changes only when the size does; tests/test_code_size.py checks the README against it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN, END = "<!-- code-size: begin -->", "<!-- code-size: end -->"
PACKAGES = {
    "helpers/": "the toolkit the notebooks import",
    "helpers/suite/": "the runner, results and report",
    "helpers/doctor/": "the doctor",
}


def _package(folder: Path) -> tuple[int, int]:
    modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
    return len(modules), sum(len(p.read_text().splitlines()) for p in modules)


def _cells(nb: Path, kind: str) -> list[str]:
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == kind]


def _notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("*.ipynb"))


def _code_cells() -> list[int]:
    return [len(code.splitlines()) for nb in _notebooks() for code in _cells(nb, "code")]


def unit_sizes() -> list[dict]:
    """Each notebook's code cells, code lines and words of markdown (a word is what
    `str.split()` finds), in teaching order."""
    return [
        {
            "notebook": nb.stem,
            "code cells": len(code := _cells(nb, "code")),
            "code lines": sum(len(c.splitlines()) for c in code),
            "markdown words": sum(len(m.split()) for m in _cells(nb, "markdown")),
        }
        for nb in _notebooks()
    ]


def unit_table() -> str:
    """One row per notebook, for `--notebooks`."""
    rows = ["| notebook | code cells | code lines | markdown words |", "|---|---|---|---|"]
    rows += [
        f"| {u['notebook']} | {u['code cells']} | {u['code lines']:,} | {u['markdown words']:,} |"
        for u in unit_sizes()
    ]
    return "\n".join(rows)


def table() -> str:
    """The Markdown table the README holds between its markers."""
    rows = ["| part | modules | lines (nearest 100) | what it is |", "|---|---|---|---|"]
    for name, what in PACKAGES.items():
        modules, lines = _package(ROOT / name)
        rows.append(f"| `{name}` | {modules} | {round(lines, -2):,} | {what} |")
    cells = _code_cells()
    longest = math.ceil(max(cells) / 10) * 10
    rows.append(
        f"| notebook code cells | {len(cells)} cells | {round(sum(cells), -2):,} "
        f"| the longest at most {longest} lines |"
    )
    units = unit_sizes()
    words = [u["markdown words"] for u in units]
    rows.append(
        f"| notebook markdown | {len(units)} notebooks | {round(sum(words), -2):,} words "
        f"| the longest unit at most {math.ceil(max(words) / 100) * 100:,} words |"
    )
    return "\n".join(rows)


def readme_table() -> str | None:
    """The table now in the README, or None when its markers are missing."""
    text = README.read_text()
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update README.md in place")
    parser.add_argument("--notebooks", action="store_true", help="one row per notebook")
    args = parser.parse_args()
    if args.notebooks:
        print(unit_table())
        return
    if not args.write:
        print(table())
        return
    text = README.read_text()
    head, rest = text.split(BEGIN, 1)
    README.write_text(f"{head}{BEGIN}\n{table()}\n{END}{rest.split(END, 1)[1]}")
    print(f"wrote the code-size table into {README.name}")


if __name__ == "__main__":
    main()
