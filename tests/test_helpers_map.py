"""The map in `helpers/__init__.py` names every module of the package and of its tooling
subpackage, `helpers.suite`, and nothing that is not there: it cannot go stale."""

import re
from pathlib import Path

import helpers

HELPERS = Path(helpers.__file__).parent
ENTRY = re.compile(r"^  ([a-z_0-9]+) {2,}\S", re.M)  # "  name   what it is for"


def _modules(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}


def test_the_map_names_every_module_and_nothing_else():
    core, tooling = helpers.__doc__.split("\nhelpers.suite:", 1)
    tooling, doctor = tooling.split("\nhelpers.doctor:", 1)
    assert set(ENTRY.findall(core)) == _modules(HELPERS)
    assert set(ENTRY.findall(tooling)) == _modules(HELPERS / "suite")
    assert set(ENTRY.findall(doctor)) == _modules(HELPERS / "doctor")
    # each module once, and no subpackage but the tooling and the doctor
    assert len(ENTRY.findall(helpers.__doc__)) == sum(
        len(_modules(HELPERS / sub)) for sub in ("", "suite", "doctor")
    )
    assert {p.parent.name for p in HELPERS.glob("*/__init__.py")} == {"suite", "doctor"}
