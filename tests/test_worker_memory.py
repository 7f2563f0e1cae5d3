"""helpers.pipelines: sampling the memory DataLoader workers take, live worker detection."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from helpers import pipelines as wm

pytestmark = pytest.mark.slow  # samples DataLoader worker processes


def _hold(mb: int, ready, release) -> None:
    block = bytearray(mb * 2**20)  # touched, so it is resident and unique to this process
    for i in range(0, len(block), 4096):
        block[i] = 1
    ready.set()
    release.wait(60)


def _sample_one_child(out) -> None:
    """The scenario, in a fresh small interpreter: a big test process's own memory moves while
    it samples (threads and caches of earlier tests), which would land in `added_mb`."""
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(64, ready, release))
    with wm.WorkerMemorySampler(interval=0.05) as mem:
        p.start()
        if not ready.wait(60):
            out.put("the child did not touch its memory within 60 s")
            return
        # several samples while the child holds its memory, however slow or busy the machine
        # (a fixed sleep can pass with the sampler's thread never scheduled)
        taken, deadline = len(mem.samples), time.monotonic() + 60
        while len(mem.samples) < taken + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        release.set()
    p.join()
    out.put({**mem.summary(), "live": wm.live_workers()})


def test_sampler_sees_a_child_and_its_memory():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    parent = ctx.Process(target=_sample_one_child, args=(out,))
    parent.start()
    s = out.get(timeout=180)
    parent.join(60)
    assert isinstance(s, dict), s
    assert s["workers"] == 1
    assert s["uss_mb"] >= 60  # the 64 MB it touched
    assert s["rss_mb"] >= s["uss_mb"]
    # counted once in the total, not as a share of pages it shares with its parent
    assert 50 <= s["added_mb"] <= 120
    assert s["live"] == []


def test_sampler_without_children():
    with wm.WorkerMemorySampler(interval=0.02) as mem:
        time.sleep(0.5)
    s = mem.summary()
    assert s["workers"] == 0 and s["samples"] >= 1 and s["added_mb"] == 0


def test_bad_interval():
    with pytest.raises(
        ValueError,
        match="WorkerMemorySampler: interval must be a positive finite number of seconds",
    ):
        wm.WorkerMemorySampler(interval=0)


def test_private_pss_of_this_process():
    import os

    import psutil

    if not os.access("/proc/self/smaps_rollup", os.R_OK):
        pytest.skip("no /proc/self/smaps_rollup here: private_pss can only return its fallback")
    value = wm.private_pss(os.getpid(), fallback=-1)
    assert 0 < value <= psutil.Process().memory_info().rss
    assert wm.private_pss(10**9, fallback=-7) == -7
