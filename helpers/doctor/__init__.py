"""The bottleneck doctor: the suite's lessons applied to a training loop the suite did not write.

In a notebook::

    from helpers import doctor
    for X, y in doctor.watch(loader):   # the loop stops once the doctor has seen enough
        ...                             # the learner's own step, with optimizer.step()

From a shell (the script unmodified, stopped after its steps)::

    python -m helpers.doctor --steps 30 --timeout 300 [--json] script.py [script args...]

Modules: session (the engine: windows of optimizer steps), counting (the dispatch-level
counter), profiled (reading the windows and the machine's rates), rules (thresholds and
findings), watch (the in-notebook form), text (the words), cli (the shell form).
"""

from .rules import Finding, Measured, diagnose
from .text import render
from .watch import Watch, watch

__all__ = ["Finding", "Measured", "Watch", "diagnose", "render", "watch"]
