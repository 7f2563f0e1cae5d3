"""Process lifetimes: children that die with their parent, and ending a whole tree of processes.

Neither `subprocess` nor `torch.distributed` offers these: a rank whose launching kernel died
would otherwise go on training, and a worker's own children would outlive it. On Linux the
kernel signals a child when its parent dies (`prctl(PR_SET_PDEATHSIG)`); elsewhere the launcher
and the suite end the tree themselves (`end_tree`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable, Iterable

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()  # looked up once, so the pre-exec hook below only makes the call


def parent_death_hook(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `sig` when this process (more
    exactly, the thread that starts it) ends, however it ends. None where prctl is missing."""
    if _PRCTL is None:
        return None
    parent = os.getpid()

    def hook() -> None:
        _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: nothing would signal us
            os.kill(os.getpid(), sig)

    return hook


def become_subreaper() -> bool:
    """Linux: orphaned descendants (a rank whose kernel died) are re-parented to this process
    instead of init, so `end_tree` still finds them. False where unsupported."""
    return _PRCTL is not None and _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def end_tree(roots: Iterable[int] | None = None, grace: float = 3.0) -> list[int]:
    """SIGTERM to each process in `roots` and all its descendants (default: every descendant of
    this process, not itself), SIGKILL to what is left after `grace` s; returns their pids.
    psutil, not `os.killpg`: a rank may start a session of its own, and Windows has neither."""
    procs: list[psutil.Process] = []
    for pid in ([os.getpid()] if roots is None else roots):
        try:
            root = psutil.Process(pid)
            procs += ([] if roots is None else [root]) + root.children(recursive=True)
        except psutil.Error:
            continue
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in procs]

