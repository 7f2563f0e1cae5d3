import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from helpers.suite import runner, runs

pytestmark = pytest.mark.slow  # runs notebooks in kernels, signals a run, starts two at once


def test_execute_writes_an_executed_copy_and_leaves_the_source(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 6 * 7\nprint(x)")]
    src = tmp_path / "99_tiny.ipynb"
    nbformat.write(nb, src)
    before = src.read_text()
    out = tmp_path / "out"
    out.mkdir()
    res = runner.execute(src, out, timeout=120)
    assert res["status"] == "ok"
    executed = nbformat.read(out / "99_tiny.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"].strip() == "42"
    assert src.read_text() == before


@pytest.mark.parametrize(
    "message, tries, status",
    [
        (
            "Kernel died before replying to kernel_info",
            2,
            "ok",
        ),  # a port taken meanwhile: start anew
        ("No kernel is running!", 1, "failed"),  # anything else is reported, not retried
    ],
)
def test_a_kernel_that_dies_before_any_cell_is_started_once_more(
    tmp_path, monkeypatch, message, tries, status
):
    real, calls = runner.NotebookClient.execute, []

    def dies_first(
        self, **kw
    ):  # what jupyter_client raises when the kernel could not bind its ports
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError(message)
        return real(self, **kw)

    monkeypatch.setattr(runner.NotebookClient, "execute", dies_first)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print(6 * 7)")]
    nbformat.write(nb, tmp_path / "97_start.ipynb")
    res = runner.execute(tmp_path / "97_start.ipynb", tmp_path / "out", timeout=120)
    assert (res["status"], len(calls)) == (status, tries), res


class _NoShell:
    """A kernel client whose shell channel must not be used (what HeadlessOutputWidget avoids)."""

    class shell_channel:  # the attribute nbclient reads
        @staticmethod
        def send(msg):
            raise AssertionError(f"sent on the shell channel: {msg}")

    class session:
        @staticmethod
        def msg(*args, **kwargs):
            return {}


def test_headless_output_widgets_record_outputs_and_send_nothing_to_the_kernel():
    nb = nbformat.v4.new_notebook()
    client = runner.headless_client(nb, timeout=30)
    widget_class = client.widget_registry["@jupyter-widgets/output"]["OutputModel"]
    assert widget_class is runner.HeadlessOutputWidget
    client.widget_state["c1"] = {}  # as nbclient does on the widget's comm_open
    widget = widget_class("c1", {"outputs": []}, _NoShell(), client)
    stream = {
        "header": {"msg_type": "stream"},
        "parent_header": {"msg_id": "m1"},
        "content": {"name": "stdout", "text": "x is 3\n"},
        "msg_type": "stream",
    }
    widget.output([], stream, None, 0)  # nbclient's own OutputWidget would send here
    widget.clear_output([], {"parent_header": {}, "content": {"wait": False}}, 0)
    widget.output([], stream, None, 0)
    assert [o["text"] for o in widget.outputs] == ["x is 3\n"]


def test_interact_cells_run_headless_with_their_output(tmp_path):
    cells = [nbformat.v4.new_code_cell("from ipywidgets import IntSlider, interact")] + [
        nbformat.v4.new_code_cell(
            f"def show(x={i}):\n    print('x is', x)\n\n\n_ = interact(show, x=IntSlider({i}))"
        )
        for i in range(5)
    ]
    path = tmp_path / "widgets.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    out = runner.execute(path, tmp_path / "out", timeout=60)
    assert out["status"] == "ok", out


def test_failing_notebook_is_reported(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("raise ValueError('boom')")]
    src = tmp_path / "98_bad.ipynb"
    nbformat.write(nb, src)
    res = runner.execute(src, tmp_path, timeout=120)
    assert res["status"] == "failed" and "boom" in res["error"]


def test_save_reference_copies_results_into_a_device_named_folder(tmp_path, monkeypatch):
    from helpers import paths
    from helpers.suite import results

    monkeypatch.setattr(paths, "reference_results_dir", lambda: tmp_path / "reference")
    res = tmp_path / "results"
    record = results.Recorder("01_test", profile="full", directory=res)
    record.measure("samples/s", 5.0, "samples/s")
    record.data["hardware"] = {
        "cpu": "Some CPU",
        "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1}],
    }
    record.save()
    target = runner.save_reference(res)
    assert target.parent == tmp_path / "reference"
    assert target.name.endswith("_NVIDIA-H100-80GB-HBM3") and target.name[:4].isdigit()
    saved = results.load_all(target)
    assert [r["notebook"] for r in saved] == ["01_test"] and saved[0]["measurements"][0][
        "value"
    ] == 5.0
    # the report picks the folder up as a reference run
    from helpers.suite import report

    rep = report.build(results.load_all(res))
    assert [name for name, _ in rep["references"]] == [target.name]


def test_save_reference_refuses_an_empty_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="no result files"):
        runner.save_reference(tmp_path)


def test_reference_run_dir_rejects_a_blank_device_name():
    with pytest.raises(ValueError, match="device_name"):
        runs.reference_run_dir("  ")
    assert runs.reference_run_dir("AMD EPYC", date="2026-01-02").name == "2026-01-02_AMD-EPYC"


def test_executed_copies_carry_the_plots_even_from_a_shell_with_agg(tmp_path, monkeypatch):
    """`make run` draws inline whatever the caller's MPLBACKEND: the copies and the report show
    plots."""
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"
        )
    ]
    nbformat.write(nb, nbs / "99_plot.ipynb")
    monkeypatch.setattr(runner, "NOTEBOOKS", nbs)
    monkeypatch.setenv("MPLBACKEND", "Agg")  # restored after the test, whatever main() sets
    monkeypatch.setenv("FTG_PROFILE", "smoke")
    assert runner.main(["--profile", "smoke", "--notebooks", "99_*"]) == 0
    (copy,) = (tmp_path / "build").rglob("99_plot.ipynb")
    outputs = nbformat.read(copy, as_version=4).cells[0].outputs
    assert any("image/png" in o.get("data", {}) for o in outputs), [o.output_type for o in outputs]


def test_main_restores_the_environment_and_ends_only_what_it_started(tmp_path, monkeypatch):
    """A caller (a test runner, a CI script, a notebook) keeps its environment and its own
    processes; the notebook's leftover process is ended."""
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    nb = nbformat.v4.new_notebook()
    sleeper = "[sys.executable, '-c', 'import time; time.sleep(60)']"
    leftover = f"import subprocess, sys\nsubprocess.Popen({sleeper})"
    nb.cells = [nbformat.v4.new_code_cell(leftover)]
    nbformat.write(nb, nbs / "99_leaves_a_process.ipynb")
    monkeypatch.setattr(runner, "NOTEBOOKS", nbs)
    monkeypatch.delenv("FTG_RESULTS_DIR", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    before = dict(os.environ)
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert runner.main(["--profile", "smoke", "--notebooks", "99_*"]) == 0
        assert mine.poll() is None, "main() ended a process its caller had started"
        assert dict(os.environ) == before
        run = json.loads((tmp_path / "build" / "latest" / "run.json").read_text())
        assert "were ended" in run["notebooks"]["99_leaves_a_process"]["note"]
    finally:
        mine.kill()
        mine.wait()


def test_importing_the_runner_imports_no_torch():
    """`python -m helpers.suite --help`, the report and the tests start without torch's seconds."""
    code = "import sys, helpers.suite.runner; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


# --- make run never loses or misrepresents results ---------------------------------------------

import psutil  # noqa: E402

from helpers import paths  # noqa: E402

RECORD = (
    "from helpers.suite import results\n"
    "record = results.Recorder('{0}', profile='smoke')\n"
    "record.measure('answer', 42.0, 'units')"
)


def _notebooks(folder: Path, **cells: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, sources in cells.items():
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(s.format(name)) for s in sources]
        nbformat.write(nb, folder / f"{name}.ipynb")
    return folder


def _suite(tmp_path: Path, source: Path, *extra: str, **popen) -> subprocess.Popen:
    env = {
        **os.environ,
        "FTG_BUILD_DIR": str(tmp_path / "build"),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")])
        ),
    }
    env.pop("FTG_RESULTS_DIR", None)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "helpers.suite",
            "--profile",
            "smoke",
            "--source",
            str(source),
            "--timeout",
            "120",
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def _run_log(build: Path) -> dict:
    return json.loads((build / "latest" / "run.json").read_text())


def test_every_kind_of_failure_is_recorded_and_the_others_still_run(tmp_path):
    """A cell error, a kernel that exits (os._exit), one killed like the OOM killer does: each
    is failed with its reason and its partly executed copy; the rest run. (Cell timeouts: below.)"""
    src = _notebooks(
        tmp_path / "nbs",
        **{
            "01_ok": [
                RECORD,
                "import torch\nwith torch.profiler.profile():\n    torch.ones(2) + 1",
            ],
            "02_dies": [RECORD, "import os; os._exit(1)", "print('never')"],
            "03_oom": ["import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
            "04_error": ["raise ValueError('boom')"],
            "06_ok": [RECORD],
        },
    )
    p = _suite(tmp_path, src)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 1, out
    build = tmp_path / "build"
    log = _run_log(build)
    nbs = log["notebooks"]
    assert log["state"] == "finished" and list(nbs) == [
        "01_ok",
        "02_dies",
        "03_oom",
        "04_error",
        "06_ok",
    ]
    assert nbs["01_ok"]["status"] == nbs["06_ok"]["status"] == "ok"
    assert "kernel died: it exited with status 1" in nbs["02_dies"]["error"]
    assert "killed by SIGKILL" in nbs["03_oom"]["error"]
    assert "ValueError: boom" in nbs["04_error"]["error"]
    copy = nbformat.read(build / "latest" / "notebooks" / "02_dies.ipynb", as_version=4)
    assert "failed" in copy.cells[0].source and copy.cells[1].outputs[0]["text"].startswith(
        "[measured] answer"
    )
    md = (build / "report.md").read_text()
    run_md = (build / "latest" / "report.md").read_text()
    # the same report in both places, each with links relative to itself that resolve
    assert md.replace("runs/" + log["run"] + "/", "") == run_md
    import re as _re

    for folder, text in ((build, md), (build / "latest", run_md)):
        links = _re.findall(r"\]\(([^)]+\.html)\)", text)
        assert links and all((folder / link).exists() for link in links), links
    assert "finished, 5 notebook(s)" in md and "## 02_dies" in md and "## 06_ok" in md
    assert "- 03_oom: the kernel died: killed by SIGKILL" in md
    # the kernels' own stderr (the profiler's USDT lines, ipykernel's TCP warning) goes to a
    # log per notebook, not into the run's output
    assert "USDT" not in out and "without encryption" not in out, out
    assert "without encryption" in (build / "latest" / "notebooks" / "01_ok.kernel.log").read_text()


def test_a_cell_timeout_is_recorded_with_the_partly_executed_copy(tmp_path):
    src = _notebooks(
        tmp_path / "nbs", **{"01_slow": ["print('started')", "import time; time.sleep(600)"]}
    )
    res = runner.execute(src / "01_slow.ipynb", tmp_path / "out", timeout=3)
    assert res["status"] == "failed" and "cell timed out after 3 s" in res["error"]
    copy = nbformat.read(tmp_path / "out" / "01_slow.ipynb", as_version=4)
    assert copy.cells[1].outputs[0]["text"].strip() == "started"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_a_signal_stops_the_run_ends_every_process_and_reports_what_finished(sig, tmp_path):
    marker = tmp_path / "worker.pid"
    hang = (
        "import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
        "start_new_session=True)\n"
        f"open({str(marker)!r}, 'w').write(str(w.pid))\n"
        "time.sleep(600)"
    )
    src = _notebooks(
        tmp_path / "nbs", **{"01_ok": [RECORD], "02_hangs": [RECORD, hang], "03_never": [RECORD]}
    )
    build = tmp_path / "build"
    (build).mkdir()
    (build / "report.md").write_text("an old report")
    p = _suite(tmp_path, src, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline and p.poll() is None, p.stdout.read()
            time.sleep(0.2)
        md = (build / "report.md").read_text()
        assert "IN PROGRESS" in md and "running 02_hangs" in md, "the old report was left standing"
        family = psutil.Process(p.pid).children(recursive=True)
        assert int(marker.read_text()) in {c.pid for c in family}
        if sig == signal.SIGINT:
            os.killpg(p.pid, sig)  # a terminal's Ctrl-C goes to the whole foreground group
        else:
            p.send_signal(sig)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 128 + sig, out
    gone, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, f"left running after {sig.name}: {alive}"
    log = _run_log(build)
    assert log["state"] == "interrupted" and log["stopped_by"] == sig.name
    assert log["notebooks"]["01_ok"]["status"] == "ok"
    assert log["notebooks"]["02_hangs"]["status"] == "interrupted" and log["not_run"] == [
        "03_never"
    ]
    md = (build / "report.md").read_text()
    assert f"INTERRUPTED** by {sig.name}" in md and "not run: 03_never" in md
    assert (
        "## 01_ok" in md and "## 02_hangs" in md
    )  # what finished, and what the stopped one measured
    assert (build / "latest" / "notebooks" / "02_hangs.ipynb").exists()


def test_two_runs_at_once_keep_their_own_results(tmp_path):
    src = _notebooks(tmp_path / "nbs", **{"01_ok": [RECORD, "import time; time.sleep(3)"]})
    procs = [_suite(tmp_path, src) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    runs = sorted((tmp_path / "build" / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        assert json.loads((run / "run.json").read_text())["state"] == "finished"
        assert (
            json.loads((run / "results" / "01_ok.json").read_text())["measurements"][0]["value"]
            == 42.0
        )
    assert not (tmp_path / "build" / "results").exists(), "a run wrote outside its own folder"
