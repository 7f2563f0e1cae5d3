"""An explore callback never runs beside a cell, in a kernel driven the way JupyterLab drives it.

JupyterLab 4.6 sends widget messages over a kernel subshell ("comms over subshells", on by
default), and ipykernel 7 routes a comm's messages to the subshell that last received from it:
from the second change of a control on, its callback runs in the subshell's thread, at the same
time as the cell the kernel is running. The test does what the browser does: it changes a control
once while the kernel is idle, starts a long cell, and changes the control again while that cell
runs. A plain callback then runs in the middle of the cell (checked too, so the test knows the
situation arose); once `plotting.one_at_a_time` has wrapped it, it waits for the cell, and its
plot lands in its own output, not in the cell's.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import time

import pytest
from jupyter_client.manager import start_new_kernel

from helpers import paths

SETUP = """
import threading, time
import ipywidgets as widgets
import matplotlib.pyplot as plt
from helpers.plotting import one_at_a_time

log = []
callback_started = threading.Event()

def explore(x=1):
    callback_started.set()
    log.append(["start", x, threading.current_thread().name, time.monotonic()])
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, x])
    plt.show()
    log.append(["end", x, threading.current_thread().name, time.monotonic()])

callback = one_at_a_time(explore) if {wrapped} else explore
dropdown = widgets.Dropdown(options=[1, 2, 3], value=1)
widgets.interact(callback, x=dropdown)
"""
# The long cell: it waits for the callback to start (a plain callback does, in the subshell) or,
# wrapped, for a few seconds in which the callback must not start.
LONG_CELL = """
cell_span = [time.monotonic()]
callback_started.clear()
callback_started.wait({wait_s})
cell_span.append(time.monotonic())
"""


class Kernel:
    """A kernel plus the three message streams the test needs."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # draw inline, as in Lab
        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(paths.ROOT), env=env)
        self.iopub: list[dict] = []

    def execute(self, code: str, timeout: float = 120) -> dict:
        msg_id = self.kc.execute(code)
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                assert reply["content"]["status"] == "ok", reply["content"]
                return reply

    def value(self, expression: str):
        msg_id = self.kc.execute("", user_expressions={"v": expression})
        while True:
            reply = self.kc.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                return eval(reply["content"]["user_expressions"]["v"]["data"]["text/plain"])

    def new_subshell(self) -> str:
        self.kc.control_channel.send(self.kc.session.msg("create_subshell_request", {}))
        return self.kc.control_channel.get_msg(timeout=30)["content"]["subshell_id"]

    def change(self, comm_id: str, index: int, subshell_id: str) -> str:
        """Send the update a Dropdown sends when the learner picks another option."""
        msg = self.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {
            "method": "update", "state": {"index": index}, "buffer_paths": []}})
        msg["header"]["subshell_id"] = subshell_id
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def wait_iopub(self, predicate, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                continue
            self.iopub.append(msg)
            if predicate(msg):
                return msg
        raise AssertionError(f"no such iopub message within {timeout} s; last: "
                             f"{[m['msg_type'] for m in self.iopub[-10:]]}")

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def _image_for(parent_id: str):
    return lambda m: (m["parent_header"].get("msg_id") == parent_id
                      and m["msg_type"] == "display_data" and "image/png" in m["content"]["data"])


def _run(wrapped: bool) -> dict:
    k = Kernel()
    try:
        k.execute(SETUP.format(wrapped=wrapped))
        comm_id = k.value("dropdown.comm.comm_id")
        subshell = k.new_subshell()
        # First change, kernel idle: handled on the main thread; its echo routes the comm's
        # next messages to the subshell, as in JupyterLab.
        first = k.change(comm_id, 1, subshell)
        k.wait_iopub(_image_for(first), timeout=60)
        k.wait_iopub(lambda m: m["parent_header"].get("msg_id") == first
                     and m["msg_type"] == "status" and m["content"]["execution_state"] == "idle", 60)
        # Second change while a long cell runs.
        long_id = k.kc.execute(LONG_CELL.format(wait_s=3 if wrapped else 30))
        k.wait_iopub(lambda m: m["parent_header"].get("msg_id") == long_id
                     and m["msg_type"] == "execute_input", timeout=60)
        second = k.change(comm_id, 2, subshell)
        k.wait_iopub(_image_for(second), timeout=90)
        while True:   # the long cell's reply
            reply = k.kc.get_shell_msg(timeout=90)
            if reply["parent_header"].get("msg_id") == long_id:
                break
        log, span = k.value("log"), k.value("cell_span")
        cell_images = [m for m in k.iopub if _image_for(long_id)(m)]
        return {"log": log, "span": span, "cell_images": cell_images}
    finally:
        k.close()


@pytest.mark.timeout(300)
@pytest.mark.skipif(sys.platform == "win32", reason="kernel subshells: POSIX runs only here")
def test_a_plain_callback_runs_beside_the_cell_so_the_situation_is_real():
    out = _run(wrapped=False)
    start = next(e for e in out["log"] if e[0] == "start" and e[1] == 3)
    assert start[2].startswith("subshell"), \
        f"the second change ran on {start[2]!r}: the kernel no longer runs callbacks in a subshell"
    assert out["span"][0] <= start[3] <= out["span"][1], json.dumps(out, default=str)


@pytest.mark.timeout(300)
@pytest.mark.skipif(sys.platform == "win32", reason="kernel subshells: POSIX runs only here")
def test_one_at_a_time_waits_for_the_running_cell():
    out = _run(wrapped=True)
    start = next(e for e in out["log"] if e[0] == "start" and e[1] == 3)
    assert start[2].startswith("subshell"), start
    assert start[3] >= out["span"][1], \
        f"the callback started {out['span'][1] - start[3]:.2f} s before the running cell ended"
    assert not out["cell_images"], "the callback's plot was shown in the running cell's output"
