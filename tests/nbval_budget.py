"""pytest plugin for the notebook run (`-p tests.nbval_budget`): time budgets and stated skips.

After the last cell of each notebook it adds one more test item, `<notebook>::budget`, which
fails when the notebook's cells (kernel start included) took longer than the budget in
`notebooks/catalog.toml`, or when the notebook is missing from the catalog. A notebook the
catalog marks with `skip_reason` is skipped with that reason, never silently.

A budget is the time on a machine the notebook has to itself. When other programs load the
machine while it runs (another `make run`, other users), the budget grows by the share of the
cores they took, read from the load average (`allowed_seconds`): slower, not red.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest

from helpers.processes import usable_cores
from helpers.suite import catalog

CATALOG = Path(
    os.environ.get(
        "FTG_CATALOG", Path(__file__).resolve().parents[1] / "notebooks" / "catalog.toml"
    )
)
_durations: dict[str, float] = defaultdict(float)
_load: dict[str, float] = defaultdict(float)  # the highest 1-minute load average seen per notebook


def _load_now() -> float:
    """The 1-minute load average (`FTG_BUDGET_LOAD` fixes it: the plugin's own tests)."""
    if os.environ.get("FTG_BUDGET_LOAD"):
        return float(os.environ["FTG_BUDGET_LOAD"])
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def allowed_seconds(budget: float, load: float, cores: int) -> float:
    """The budget, stretched by other programs' load: the notebook may keep every core busy
    itself (a load of `cores`); load beyond that is someone else's, and with it the notebook
    gets `cores / load` of the machine."""
    others = max(0.0, load - cores)
    return budget * (1 + others / cores)


class BudgetItem(pytest.Item):
    def __init__(self, *, entry: dict | None, nb: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.entry, self.nb = entry, nb

    def runtest(self) -> None:
        if self.entry is None:
            raise AssertionError(f"{self.nb} is missing from notebooks/catalog.toml")
        took, budget = _durations[self.nb], self.entry["budget_seconds"]
        allowed = allowed_seconds(budget, _load[self.nb], usable_cores())
        if took > allowed:
            stretched = (
                f" ({allowed:.0f} s allowed: load average {_load[self.nb]:.1f} "
                f"on {usable_cores()} cores)"
                if allowed > budget
                else ""
            )
            raise AssertionError(
                f"{self.nb} took {took:.0f} s, over its smoke budget of {budget} s{stretched}"
            )

    def reportinfo(self):
        return self.path, None, f"{self.nb}::budget"


def pytest_collection_modifyitems(session, config, items) -> None:
    entries = {e["file"]: e for e in catalog.load(CATALOG)}
    out, last_parent = [], None
    for item in items + [None]:
        parent = item.parent if item is not None and str(item.path).endswith(".ipynb") else None
        if last_parent is not None and parent is not last_parent:
            nb = Path(last_parent.path).name
            out.append(
                BudgetItem.from_parent(last_parent, name="budget", entry=entries.get(nb), nb=nb)
            )
        if item is not None:
            if parent is not None:
                entry = entries.get(Path(item.path).name) or {}
                if entry.get("skip_reason"):
                    item.add_marker(pytest.mark.skip(reason=entry["skip_reason"]))
            out.append(item)
        last_parent = parent
    items[:] = out


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb") and not report.nodeid.endswith("::budget"):
        _durations[Path(path).name] += report.duration
        _load[Path(path).name] = max(_load[Path(path).name], _load_now())
