"""Process lifetimes: a child that dies with its parent, and ending a whole tree of processes.

Hand-written because neither `subprocess` nor `torch.distributed` offers it: a rank whose
launching kernel dies would otherwise keep training (or retry a dead rendezvous) for a minute
or more. On Linux the kernel delivers a signal when the parent dies (`prctl(PR_SET_PDEATHSIG)`);
elsewhere a watchdog thread notices that the parent process is gone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import psutil

from .checks import check_int, check_seconds

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()  # looked up once, so the pre-exec hook below only makes the call


def parent_death_hook(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `sig` when this process (more
    exactly, the thread that starts it) ends, however it ends. None where Linux's prctl is
    missing; use `die_with_parent` in the child there."""
    if _PRCTL is None:
        return None
    parent = os.getpid()

    def hook() -> None:
        _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: nothing would signal us
            os.kill(os.getpid(), sig)

    return hook


def die_with_parent(sig: int = signal.SIGTERM, *, parent: int | None = None,
                    poll: float = 0.5) -> str:
    """Make this process receive `sig` when its parent dies (Linux prctl; else a watchdog
    thread polling every `poll` s). `parent`: the pid expected as parent (default: the
    current one); if it is already gone, the signal comes at once. Returns the mechanism."""
    check_int("sig", sig, 1, where="die_with_parent")
    check_seconds("poll", poll, where="die_with_parent")
    parent = os.getppid() if parent is None else parent
    if _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0:
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)
        return "prctl"

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os.kill(os.getpid(), sig)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()
    return "watchdog"


def become_subreaper() -> bool:
    """Linux: orphaned descendants (a rank whose kernel died) are re-parented to this process
    instead of init, so `end_descendants` still finds them. False where unsupported."""
    return _PRCTL is not None and _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def end_descendants(grace: float = 3.0, pid: int | None = None) -> list[int]:
    """Terminate every descendant of `pid` (default: this process), then kill what is left
    after `grace` seconds. Returns the pids that were running."""
    try:
        procs = psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in procs]
