"""The launcher starts real ranks, streams their output, and never leaves a process behind;
nothing it starts listens beyond loopback."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers import launch, processes
from tests.interrupt import interruptible

pytestmark = pytest.mark.slow  # launches ranks and ends them

HOLD = Path(__file__).with_name("rank_hold.py")


def _no_children_left(pids: list[int]) -> None:
    for pid in pids:
        if psutil.pid_exists(pid):
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"pid {pid} still runs"
    kids = [
        c
        for c in psutil.Process().children(recursive=True)
        if c.is_running() and c.status() != psutil.STATUS_ZOMBIE
    ]
    assert not kids, f"processes left behind: {kids}"


def _script(folder: Path, code: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if not code:
        return Path(shutil.copy(HOLD, folder / "rank_hold.py"))
    (folder / "s.py").write_text(code)
    return folder / "s.py"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"nprocs": 0}, "run: nprocs must be an int >= 1, got 0"),
        ({"nprocs": 1.5}, "nprocs"),
        ({"threads": 0}, "threads"),
        ({"timeout": 0}, "timeout"),
    ],
)
def test_bad_input_is_refused_before_starting(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        launch.run(_script(tmp_path), **kwargs)
    with pytest.raises(FileNotFoundError, match="script .*nothere.py.* is not a file"):
        launch.run(tmp_path / "nothere.py")


def test_ranks_get_torchruns_variables_and_their_output_is_filed_by_rank(tmp_path):
    code = (
        "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['LOCAL_RANK'],"
        " os.environ['OMP_NUM_THREADS'], os.environ['INIT_METHOD'][:7], os.getcwd())"
    )
    r = launch.run(_script(tmp_path, code), nprocs=3, threads=2, stream=False, timeout=120)
    for rank in range(3):
        assert r.outputs[rank] == [f"{rank} 3 {rank} 2 file:// {r.folder}"]
    assert r.folder.parent == tmp_path.resolve() and r.results == {}
    _no_children_left(r.pids)


def test_results_are_read_once(tmp_path):
    """A notebook reads `results` in loops (18's sharding run writes MBs of weights per rank):
    the files are parsed once, not at every access."""
    (tmp_path / "rank0.json").write_text('{"rank": 0, "loss": 1.0}')
    r = launch.RunResult(nprocs=1, seconds=0.0, folder=tmp_path, outputs={0: []})
    first = r.results
    (tmp_path / "rank0.json").write_text('{"rank": 0, "loss": 2.0}')
    assert r.results is first and first == {0: {"rank": 0, "loss": 1.0}}


def test_a_failing_rank_stops_everyone_and_is_named_with_its_traceback(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(launch.LaunchError) as err:
        launch.run(_script(tmp_path), ["--fail", 1], nprocs=2, stream=False, timeout=120)
    e = err.value
    assert e.failed_rank == 1 and "rank 1 failed (exit code 1)" in str(e)
    assert "Traceback" in e.traceback and "deliberate failure" in e.traceback
    assert time.monotonic() - t0 < 100 and e.stop_seconds < 10, e.stop_seconds
    _no_children_left(e.pids)


def test_a_rank_that_vanishes_without_a_traceback_is_named_by_its_exit_code(tmp_path):
    with pytest.raises(launch.LaunchError) as err:
        launch.run(_script(tmp_path), ["--vanish", 1], nprocs=2, stream=False, timeout=120)
    e = err.value
    assert e.failed_rank == 1 and "exit code 7" in str(e), str(e)
    _no_children_left(e.pids)


def test_timeout_ends_hung_ranks_and_their_children(tmp_path):
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('hanging', flush=True); time.sleep(60)"
    )
    t0 = time.monotonic()  # 10 s: ample for two interpreters to start their child and print
    with pytest.raises(launch.LaunchError, match="timed out after 10 s") as err:
        launch.run(_script(tmp_path, code), nprocs=2, stream=False, timeout=10)
    assert time.monotonic() - t0 < 30
    assert err.value.failed_rank is None and err.value.outputs[0] == ["hanging"]
    assert len(err.value.pids) == 4  # two ranks, each with its child
    time.sleep(0.5)
    _no_children_left(err.value.pids)


def test_two_launches_of_one_script_at_once_do_not_collide(tmp_path):
    code = (
        "import os, torch, torch.distributed as dist; "
        "dist.init_process_group('gloo', init_method=os.environ['INIT_METHOD'], "
        "rank=int(os.environ['RANK']), world_size=int(os.environ['WORLD_SIZE'])); "
        "t = torch.ones(1); dist.all_reduce(t); print(int(t)); dist.destroy_process_group()"
    )
    script, results, errors = _script(tmp_path, code), {}, []

    def go(i: int, n: int) -> None:
        try:
            results[i] = launch.run(script, nprocs=n, stream=False, timeout=180)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i, n)) for i, n in enumerate((2, 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results[0].outputs == {0: ["2"], 1: ["2"]}
    assert results[1].outputs == {0: ["3"], 1: ["3"], 2: ["3"]}
    assert results[0].folder != results[1].folder
    assert not list(tmp_path.rglob("rendezvous*"))  # the rendezvous files are gone


def test_run_folders_are_new_and_old_ones_pruned(monkeypatch, tmp_path):
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path))
    runs = tmp_path / "ddp_runs"
    for i in range(launch.KEEP_RUNS + 5):
        (runs / f"run{i:02d}").mkdir(parents=True)
        os.utime(runs / f"run{i:02d}", (1000 + i, 1000 + i))
    a, b = launch.run_folder("16_ddp"), launch.run_folder("16_ddp")
    assert a != b and a.name.startswith("16_ddp_") and a.is_dir()
    left = sorted(p.name for p in runs.iterdir() if p.name.startswith("run"))
    assert len(left) == launch.KEEP_RUNS - 2 and left[0] == "run07"


# --- loopback means loopback; ranks die with their launcher -----------------------------------


def _wait_ready(folder: Path, n: int, timeout: float = 180) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(list(folder.glob("ready*"))) < n:
        assert time.monotonic() < deadline, f"the ranks did not get ready within {timeout} s"
        time.sleep(0.2)
    time.sleep(0.2)  # the pid is written by then
    return [int(p.read_text()) for p in sorted(folder.glob("ready*"))]


def _listeners(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket the processes hold (as `ss -ltnp`)."""
    found = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        found += [(pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def test_every_listening_socket_is_on_loopback_while_a_launch_runs(tmp_path):
    """The ranks' own (gloo) sockets; the rendezvous is a file, so it opens none."""
    script, box = _script(tmp_path), {}

    def go() -> None:
        try:
            box["r"] = launch.run(script, nprocs=2, stream=False, timeout=240)
        except Exception as e:  # reported below
            box["e"] = e

    t = threading.Thread(target=go)
    t.start()
    try:
        _wait_ready(tmp_path, 2)
        family = [os.getpid()] + [c.pid for c in psutil.Process().children(recursive=True)]
        listening = _listeners(family)
        assert listening, "no listening socket found: the check would pass vacuously"
        exposed = [x for x in listening if x[1] not in ("127.0.0.1", "::1")]
        assert not exposed, f"listening beyond loopback: {exposed} (all: {listening})"
    finally:
        (tmp_path / "release").touch()
        t.join(300)
    assert "e" not in box, box.get("e")


LAUNCHER = """
import sys
from helpers import launch
launch.run(sys.argv[1], nprocs=2, stream=False, timeout=600)
"""


@pytest.mark.parametrize("how", ["killed", "ctrl-c"])
def test_ranks_end_within_seconds_when_their_launcher_dies(how, tmp_path):
    """The launching process (a kernel, in a notebook) is killed outright, or interrupted
    (Ctrl-C): its ranks end within a few seconds instead of holding on."""
    script = _script(tmp_path)
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    p = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(script)], env=env, cwd=root, preexec_fn=interruptible
    )
    try:
        ranks = _wait_ready(tmp_path, 2)
        procs = psutil.Process(p.pid).children(recursive=True)
        assert {r.pid for r in procs} == set(ranks), procs
        p.kill() if how == "killed" else p.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        gone, alive = psutil.wait_procs(procs, timeout=30)
        took = time.monotonic() - t0
        assert not alive, f"still running 30 s after their launcher was {how}: {alive}"
        assert took < 10, f"the ranks took {took:.1f} s to end after their launcher was {how}"
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        (tmp_path / "release").touch()


def test_end_tree_ends_the_process_tree_without_killpg(monkeypatch):
    """Windows has no os.killpg and no SIGKILL: the tree is ended through psutil."""
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        " time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(p.pid).children() and time.monotonic() < deadline:
            time.sleep(0.1)
        (child,) = psutil.Process(p.pid).children()
        monkeypatch.delattr(os, "killpg")
        assert sorted(processes.end_tree([p.pid], grace=0.5)) == sorted([p.pid, child.pid])
        assert p.wait(timeout=10) is not None
        child.wait(timeout=10)
        assert not child.is_running()
    finally:
        if p.poll() is None:
            p.kill()


def test_no_process_is_started_with_a_preexec_fn():
    """Python documents `preexec_fn` as unsafe in a process with threads, and a Jupyter kernel
    has threads: children ask for their parent-death signal themselves (`dies_with_parent`)."""
    import ast

    root = Path(__file__).resolve().parents[1] / "helpers"
    uses = [
        f"{p.relative_to(root.parent)}:{node.lineno}"
        for p in root.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.keyword) and node.arg == "preexec_fn"
    ]
    assert not uses, uses


def test_a_child_started_through_the_bootstrap_runs_its_script_as_main(tmp_path):
    script = tmp_path / "child.py"
    script.write_text("import sys\nprint(__name__, sys.argv[1:], sys.path[0])\n")
    out = subprocess.run(
        processes.dies_with_parent([sys.executable, str(script), "a", "b"]),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["__main__", "['a',", "'b']", str(tmp_path)]


def test_end_tree_needs_the_roots_it_ends():
    """No default of "every child of this process": a caller names what it ends."""
    with pytest.raises(TypeError):
        processes.end_tree()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="end_tree: roots must be the pids to end"):
        processes.end_tree(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="end_tree: roots must be the pids to end"):
        processes.end_tree(os.getpid())  # type: ignore[arg-type]
