"""What neither `subprocess` nor `torch.distributed` offers: children that die with their parent
(Linux: `prctl(PR_SET_PDEATHSIG)`), so a rank whose kernel died stops training; and ending a whole
tree (`end_tree`), so a worker's children do not outlive it."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
from collections.abc import Iterable, Iterator

import psutil

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 1, 36, 37
_PRCTL = None  # Linux only: the subreaper switch; its presence says the bootstrap can work
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError, AttributeError):
        _PRCTL = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl


# Run in the child before its program: it asks for the parent-death signal itself, so the parent
# needs no `preexec_fn` (which Python documents as unsafe in a process with threads, as every
# Jupyter kernel is). The signal comes when the parent *thread* that started it ends.
_BOOTSTRAP = """import ctypes, ctypes.util, os, runpy, signal, sys
parent, sys.argv = int(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != parent:  # the parent died before the call: nothing would signal us
    os.kill(os.getpid(), signal.SIGTERM)
if sys.argv[0] == "-c":
    code, sys.argv = sys.argv[1], ["-c", *sys.argv[2:]]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
else:
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def dies_with_parent(argv: list[str]) -> list[str]:
    """`argv`, a Python command line (`[python, script, *args]` or `[python, "-c", code]`),
    changed so that the child gets SIGTERM when this process ends, however it ends (Linux; the
    same `argv` elsewhere)."""
    if _PRCTL is None:
        return list(argv)
    return [argv[0], "-c", _BOOTSTRAP, str(os.getpid()), *argv[1:]]


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """Linux, inside the block: orphaned descendants are re-parented here, not to init, so
    `end_tree` finds them; the caller's setting after it. Yields whether it is in effect."""
    if _PRCTL is None:
        yield False
        return
    was = ctypes.c_int(0)
    _PRCTL(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
    on = _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield on
    finally:
        _PRCTL(PR_SET_CHILD_SUBREAPER, was.value, 0, 0, 0)


# Kineto, torch.profiler's C++ side, prints a line at every profiler start and stop (USDT) and, on
# a machine without a GPU, an ERROR from its GPU probe: noise on a learner's screen that reads
# as a failure. It reads this level at its first use; 6 is above every level it prints at.
QUIET_PROFILER = {"KINETO_LOG_LEVEL": "6"}


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, e.g. a container's limit)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def descendants() -> set[int]:
    """The pids of every process below this one now: what `started_since` leaves alone."""
    with contextlib.suppress(psutil.Error):
        return {p.pid for p in psutil.Process().children(recursive=True)}
    return set()


def started_since(before: set[int]) -> list[int]:
    """Descendants that were not there in `before` (`descendants()`): end these, not processes
    the caller had started for itself."""
    return sorted(descendants() - before)


def end_tree(roots: Iterable[int], grace: float = 3.0) -> list[int]:
    """SIGTERM to each process in `roots` and all its descendants, SIGKILL to what is left after
    `grace` s; returns their pids. The roots are required: a default of "every child of this
    process" would end what another part of the program started. psutil, not `os.killpg`: a
    rank may start a session of its own, and Windows has neither."""
    if roots is None or isinstance(roots, (int, str)):
        raise TypeError(
            f"end_tree: roots must be the pids to end (a list), got {type(roots).__name__} "
            f"{roots!r}; processes.started_since(before) gives what a block started"
        )
    procs: list[psutil.Process] = []
    for pid in roots:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            procs += [root, *root.children(recursive=True)]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in procs]
