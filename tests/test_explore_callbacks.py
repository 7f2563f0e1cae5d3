"""An explore callback never runs beside a cell or beside another widget message, in a kernel
driven the way JupyterLab drives it.

JupyterLab 4.6 sends widget messages over a kernel subshell ("comms over subshells", on by
default), and ipykernel 7 routes a comm's messages to the subshell that last received from it. So
once a comm has sent anything during a callback, its next messages are handled in the subshell's
thread, at the same time as whatever the main thread runs, each with the end-of-cell figure flush
of the `comm` package's post_execute. Two situations follow, both tested as the browser makes them:

- *a plot vanishes*: while a callback draws, JupyterLab sends back the Output widget's new
  outputs; handled in the subshell, that message's figure flush shows and closes the callback's
  half-drawn figure (or draws it while the callback does: "RendererAgg has no close_group");
- *a control moved while a cell runs*: its callback runs in the middle of the cell.

Each is run once plainly, to check that the situation arises, and once after
`plotting.one_at_a_time` has wrapped the callback, which must remove it.
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

pytestmark = pytest.mark.slow  # runs widget callbacks in a kernel

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
    if x == 2:   # a slow plot: the test sends the Output widget's echo while it is open
        print("figure open", flush=True)
        time.sleep({draw_s})
    plt.show()
    log.append(["end", x, threading.current_thread().name, time.monotonic()])

callback = one_at_a_time(explore) if {wrapped} else explore
dropdown = widgets.Dropdown(options=[1, 2, 3], value=1)
widgets.interact(callback, x=dropdown)
output = callback.widget.out
"""
# The long cell: it waits for the callback to start (a plain callback does, in the subshell) or,
# wrapped, for a few seconds in which the callback must not start.
LONG_CELL = """
cell_span = [time.monotonic()]
callback_started.clear()
print("cell running", flush=True)
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

    def change(self, comm_id: str, state: dict, subshell_id: str) -> str:
        """Send a widget state update over the subshell, as JupyterLab does."""
        msg = self.kc.session.msg(
            "comm_msg",
            {"comm_id": comm_id, "data": {"method": "update", "state": state, "buffer_paths": []}},
        )
        msg["header"]["subshell_id"] = subshell_id
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def wait_iopub(self, predicate, timeout: float) -> dict:
        """The first iopub message, already received or to come, for which `predicate` holds."""
        for msg in self.iopub:
            if predicate(msg):
                return msg
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                continue
            self.iopub.append(msg)
            if predicate(msg):
                return msg
        raise AssertionError(
            f"no such iopub message within {timeout} s; last: "
            f"{[m['msg_type'] for m in self.iopub[-10:]]}"
        )

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def _from(parent_id: str, msg_type: str):
    return lambda m: m["parent_header"].get("msg_id") == parent_id and m["msg_type"] == msg_type


def _image_for(parent_id: str):
    return lambda m: _from(parent_id, "display_data")(m) and "image/png" in m["content"]["data"]


def _idle(parent_id: str):
    return lambda m: _from(parent_id, "status")(m) and m["content"]["execution_state"] == "idle"


def _start(wrapped: bool, draw_s: float = 0) -> tuple[Kernel, str, str, str]:
    k = Kernel()
    k.execute(SETUP.format(wrapped=wrapped, draw_s=draw_s))
    return k, k.value("dropdown.comm.comm_id"), k.value("output.comm.comm_id"), k.new_subshell()


def _plot_while_the_output_echoes(wrapped: bool) -> dict:
    k, dropdown, output, subshell = _start(wrapped, draw_s=3)
    try:
        change = k.change(dropdown, {"index": 1}, subshell)  # first change: the main thread
        k.wait_iopub(
            lambda m: _from(change, "stream")(m) and "figure open" in m["content"]["text"], 60
        )
        echo = k.change(output, {"outputs": []}, subshell)
        k.wait_iopub(_idle(change), 60)
        k.wait_iopub(_idle(echo), 60)
        return {
            "shown": [m for m in k.iopub if _image_for(change)(m)],
            "taken": [m for m in k.iopub if _image_for(echo)(m)],
            "log": k.value("log"),
        }
    finally:
        k.close()


def _control_moved_during_a_cell(wrapped: bool) -> dict:
    k, dropdown, _, subshell = _start(wrapped)
    try:
        # First change, kernel idle: handled on the main thread; its echo routes the comm's
        # next messages to the subshell, as in JupyterLab.
        first = k.change(dropdown, {"index": 2}, subshell)
        k.wait_iopub(_idle(first), 60)
        # Second change while a long cell runs.
        long_id = k.kc.execute(LONG_CELL.format(wait_s=3 if wrapped else 30))
        k.wait_iopub(
            lambda m: _from(long_id, "stream")(m) and "cell running" in m["content"]["text"], 60
        )
        second = k.change(dropdown, {"index": 0}, subshell)
        # its handler's end (a plain callback's plot may be flushed under another message's parent)
        k.wait_iopub(_idle(second), 90)
        while True:  # the long cell's reply
            reply = k.kc.get_shell_msg(timeout=90)
            if reply["parent_header"].get("msg_id") == long_id:
                break
        return {
            "log": k.value("log"),
            "span": k.value("cell_span"),
            "cell_images": [m for m in k.iopub if _image_for(long_id)(m)],
        }
    finally:
        k.close()


def _last_start(log: list) -> list:
    """The second change's "start" entry: the last one (its "end" may not be logged yet when the
    log is read, since the callback can still be drawing beside the main thread)."""
    return [entry for entry in log if entry[0] == "start"][-1]


POSIX = pytest.mark.skipif(sys.platform == "win32", reason="kernel subshells: POSIX runs only here")


@pytest.mark.timeout(300)
@POSIX
def test_a_plain_callback_loses_its_plot_to_the_output_echo_so_the_situation_is_real():
    out = _plot_while_the_output_echoes(wrapped=False)
    assert out["taken"] and not out["shown"], (
        "the echo's figure flush no longer takes the callback's figure: " + json.dumps(out["log"])
    )


@pytest.mark.timeout(300)
@POSIX
def test_one_at_a_time_keeps_the_plot_in_the_callbacks_output():
    out = _plot_while_the_output_echoes(wrapped=True)
    assert len(out["shown"]) == 1 and not out["taken"], json.dumps(out["log"])


@pytest.mark.timeout(300)
@POSIX
def test_a_plain_callback_runs_beside_the_cell_so_the_situation_is_real():
    out = _control_moved_during_a_cell(wrapped=False)
    start = _last_start(out["log"])
    assert start[:2] == ["start", 1], out["log"]
    assert start[2].startswith("subshell"), (
        f"the second change ran on {start[2]!r}: the kernel no longer runs callbacks in a subshell"
    )
    assert out["span"][0] <= start[3] <= out["span"][1], json.dumps(out, default=str)


@pytest.mark.timeout(300)
@POSIX
def test_one_at_a_time_waits_for_the_running_cell():
    out = _control_moved_during_a_cell(wrapped=True)
    start = _last_start(out["log"])
    assert start[:2] == ["start", 1] and start[2].startswith("subshell"), out["log"]
    assert start[3] >= out["span"][1], (
        f"the callback started {out['span'][1] - start[3]:.2f} s before the running cell ended"
    )
    assert not out["cell_images"], "the callback's plot was shown in the running cell's output"
