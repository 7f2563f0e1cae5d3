"""pytest plugin for the notebook run (`-p tests.nbval_budget`): time budgets and stated skips.

After the last cell of each notebook it adds one more test item, `<notebook>::budget`, which
fails when the notebook's cells (kernel start included) took longer than the budget in
`notebooks/catalog.toml`, or when the notebook is missing from the catalog. A notebook the
catalog marks with `skip_reason` is skipped with that reason, never silently.
"""

from __future__ import annotations

import os
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

CATALOG = Path(os.environ.get("FTG_CATALOG", Path(__file__).resolve().parents[1] / "notebooks" / "catalog.toml"))
_durations: dict[str, float] = defaultdict(float)


def load_catalog(path: Path = CATALOG) -> dict[str, dict]:
    with open(path, "rb") as f:
        return {e["file"]: e for e in tomllib.load(f)["notebook"]}


class BudgetItem(pytest.Item):
    def __init__(self, *, entry: dict | None, nb: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.entry, self.nb = entry, nb

    def runtest(self) -> None:
        if self.entry is None:
            raise AssertionError(f"{self.nb} is missing from notebooks/catalog.toml")
        took, budget = _durations[self.nb], self.entry["budget_seconds"]
        if took > budget:
            raise AssertionError(f"{self.nb} took {took:.0f} s, over its smoke budget of {budget} s")

    def reportinfo(self):
        return self.path, None, f"{self.nb}::budget"


def pytest_collection_modifyitems(session, config, items) -> None:
    catalog = load_catalog()
    out, last_parent = [], None
    for item in items + [None]:
        parent = item.parent if item is not None and str(item.path).endswith(".ipynb") else None
        if last_parent is not None and parent is not last_parent:
            nb = Path(last_parent.path).name
            out.append(BudgetItem.from_parent(last_parent, name="budget", entry=catalog.get(nb), nb=nb))
        if item is not None:
            if parent is not None:
                entry = catalog.get(Path(item.path).name) or {}
                if entry.get("skip_reason"):
                    item.add_marker(pytest.mark.skip(reason=entry["skip_reason"]))
            out.append(item)
        last_parent = parent
    items[:] = out


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb") and not report.nodeid.endswith("::budget"):
        _durations[Path(path).name] += report.duration
