"""The bottleneck doctor: the suite's lessons applied to a training loop the suite did not write.

In a notebook::

    from helpers import doctor
    for X, y in doctor.watch(loader):   # the loop stops once the doctor has seen enough
        ...                             # the learner's own step, with optimizer.step()

From a shell (the script unmodified, stopped after its steps)::

    python -m helpers.doctor --steps 40 --timeout 300 [--json] script.py [script args...]

    python -m helpers.doctor compare before.json after.json   # two reports: did it help?

Modules: session (the engine: windows of optimizer steps), counting (the dispatch-level
counter), profiled (reading the windows and the machine's rates), copies (copies between host
and device, told apart from the profiler's events), memory (memory over time),
rules (thresholds and findings), watcher (the in-notebook form), text (the words), cli (the
shell form), compare (two reports, before and after).
"""

from importlib import import_module

__all__ = ["Finding", "Measured", "Watch", "findings", "render", "verdict", "watch"]
_WHERE = {
    "Finding": "rules",
    "Measured": "rules",
    "findings": "rules",
    "verdict": "rules",
    "render": "text",
    "Watch": "watcher",
    "watch": "watcher",
}


def __getattr__(name: str) -> object:
    """Imported on first use, so `python -m helpers.doctor` starts without importing torch
    (only the script's own process needs it)."""
    if name in _WHERE:
        return getattr(import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
