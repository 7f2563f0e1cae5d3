"""How large the code is, as the README reports it: figures for a reader, not quotas.

    python scripts/code_size.py            # print the table
    python scripts/code_size.py --write    # put it into README.md, between its markers

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


def _code_cells() -> list[int]:
    lengths = []
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        lengths += [
            len("".join(c["source"]).splitlines()) for c in cells if c["cell_type"] == "code"
        ]
    return lengths


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
    args = parser.parse_args()
    if not args.write:
        print(table())
        return
    text = README.read_text()
    head, rest = text.split(BEGIN, 1)
    README.write_text(f"{head}{BEGIN}\n{table()}\n{END}{rest.split(END, 1)[1]}")
    print(f"wrote the code-size table into {README.name}")


if __name__ == "__main__":
    main()
