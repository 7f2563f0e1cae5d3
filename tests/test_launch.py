"""The launcher starts real worker processes, returns their results, and never leaves any behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from helpers import ddp_train, launch
from tests.interrupt import interruptible

SMALL = ["--in-features", "32", "--hidden", "64", "--depth", "2", "--batch", "8"]


def _no_children_left(pids: list[int]) -> None:
    for pid in pids:
        if psutil.pid_exists(pid):
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"pid {pid} still runs"
    kids = [c for c in psutil.Process().children(recursive=True) if c.is_running()
            and c.status() != psutil.STATUS_ZOMBIE]
    assert not kids, f"processes left behind: {kids}"


@pytest.mark.parametrize("kwargs, match", [
    ({"nprocs": 0}, "nprocs"),
    ({"nprocs": -2}, "nprocs"),
    ({"nprocs": 1.5}, "nprocs"),
    ({"nprocs": []}, "nprocs"),
    ({"nprocs": [1, 0]}, "nprocs"),
    ({"backend": "mpi"}, "backend must be one of"),
    ({"threads": 0}, "threads"),
    ({"timeout": 0}, "timeout"),
    ({"init_timeout": -1}, "init_timeout"),
])
def test_bad_input_is_refused_before_starting(kwargs, match):
    with pytest.raises(ValueError, match=match):
        launch.launch("helpers.ddp_train", SMALL, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has GPUs")
def test_nccl_without_gpus_says_so():
    with pytest.raises(ValueError, match="nccl.*no.*GPU|needs CUDA"):
        launch.launch("helpers.ddp_train", SMALL, nprocs=2, backend="nccl")


def test_ddp_matches_single_process_on_the_global_batch():
    args = [*SMALL, "--steps-per-epoch", "3", "--epochs", "2", "--checkpoint", "--lr", "0.1"]
    r = launch.launch("helpers.ddp_train", args, nprocs=2, stream=False, timeout=90)
    assert set(r.results) == {0, 1}
    assert r.results[0]["checksum"] == r.results[1]["checksum"]  # replicas stay identical
    ddp = torch.load(f"{r.out_dir}/checkpoint.pt")["model"]
    ref = ddp_train.reference_train(world=2, steps_per_epoch=3, epochs=2, lr=0.1, batch=8,
                                    in_features=32, hidden=64, depth=2).state_dict()
    one_rank = ddp_train.reference_train(world=1, steps_per_epoch=3, epochs=2, lr=0.1, batch=8,
                                         in_features=32, hidden=64, depth=2).state_dict()
    for k in ref:
        torch.testing.assert_close(ddp[k], ref[k], rtol=1e-5, atol=1e-6)
    # and the check can fail: training on other data gives other weights
    assert any((ddp[k] - one_rank[k]).abs().max() > 1e-4 for k in ref)
    _no_children_left(r.pids)


def test_failing_rank_stops_everyone_and_shows_its_traceback():
    t0 = time.monotonic()
    with pytest.raises(launch.LaunchError) as err:
        launch.launch("helpers.ddp_train", [*SMALL, "--fail-rank", "1", "--fail-step", "1"],
                      nprocs=2, stream=False, timeout=60)
    took = time.monotonic() - t0
    e = err.value
    assert e.failed_rank == 1
    assert "deliberate failure" in e.traceback and "Traceback" in e.traceback
    assert "rank 1" in str(e)
    assert took < 45, f"failure took {took:.0f} s to end the run"
    assert e.stop_seconds < 10, f"stopping the other ranks took {e.stop_seconds:.1f} s"
    _no_children_left(e.pids)


def test_a_rank_that_vanishes_without_a_traceback_is_named_by_torchrun(tmp_path):
    """No exception, so no error file: torchrun's own report of the failure names the rank."""
    with pytest.raises(launch.LaunchError) as err:
        launch.launch("tests.rank_hold", ["--vanish", "1"], nprocs=2, stream=False, timeout=120,
                      out_dir=tmp_path)
    e = err.value
    assert e.failed_rank == 1 and "exitcode" in e.traceback and "7" in e.traceback, str(e)
    _no_children_left(e.pids)


def test_timeout_kills_hung_processes_and_their_children():
    # a "worker" that starts a child of its own and then hangs
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('hanging', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    with pytest.raises(launch.LaunchError, match="timed out"):
        launch.run_processes([[sys.executable, "-c", code]] * 2, [launch._env(1, "127.0.0.1")] * 2,
                             timeout=3, stream=False)
    assert time.monotonic() - t0 < 15
    time.sleep(0.5)
    _no_children_left([])
    sleepers = [p for p in psutil.process_iter(["cmdline", "ppid"])
                if p.info["cmdline"] and "time.sleep(60)" in " ".join(p.info["cmdline"])
                and p.info["ppid"] == 1]
    assert not sleepers, f"grandchildren left behind: {sleepers}"


def test_two_launches_at_once_do_not_collide():
    results, errors = {}, []

    def go(i: int) -> None:
        try:
            results[i] = launch.launch("helpers.ddp_train", [*SMALL, "--steps-per-epoch", "2"],
                                       nprocs=2, stream=False, timeout=120)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results[0].port != results[1].port
    assert all(set(r.results) == {0, 1} for r in results.values())
    _no_children_left(results[0].pids + results[1].pids)


def test_torchrun_command_names_a_c10d_rendezvous():
    cmd = launch.torchrun_command("helpers.ddp_train", ["--steps-per-epoch", "2"], nnodes=2,
                                  nproc_per_node=4, endpoint="10.0.0.1:29500", rdzv_id="job1")
    s = " ".join(cmd)
    for part in ("--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=10.0.0.1:29500", "--rdzv-id=job1", "-m helpers.ddp_train"):
        assert part in s


def test_two_torchrun_nodes_meet_at_a_c10d_rendezvous():
    r = launch.launch("helpers.ddp_train", [*SMALL, "--steps-per-epoch", "2"],
                      nprocs=[2, 1], stream=False, timeout=150)
    assert sorted(r.results) == [0, 1, 2]
    assert {res["world"] for res in r.results.values()} == {3}
    assert len({res["checksum"] for res in r.results.values()}) == 1
    _no_children_left(r.pids)


def test_old_run_folders_are_pruned(monkeypatch, tmp_path):
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path))
    runs = tmp_path / "ddp_runs"
    for i in range(launch.KEEP_RUNS + 5):
        (runs / f"run{i:02d}").mkdir(parents=True)
        os.utime(runs / f"run{i:02d}", (1000 + i, 1000 + i))
    launch._runs_dir()
    left = sorted(p.name for p in runs.iterdir())
    assert len(left) == launch.KEEP_RUNS and left[0] == "run05"


# --- loopback means loopback; ranks die with their launcher -----------------------------------

def _wait_ready(out: Path, n: int, timeout: float = 180) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(list(out.glob("ready*"))) < n:
        assert time.monotonic() < deadline, f"the ranks did not get ready within {timeout} s"
        time.sleep(0.2)
    time.sleep(0.2)  # the pid is written by then
    return [int(p.read_text()) for p in sorted(out.glob("ready*"))]


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


@pytest.mark.parametrize("nprocs", [2, [1, 1]], ids=["one node", "two nodes"])
def test_every_listening_socket_is_on_loopback_while_a_launch_runs(nprocs, tmp_path):
    """The rendezvous store, torchrun's agents and stores, and the ranks' own (gloo) sockets."""
    out = tmp_path / "out"
    out.mkdir()
    box: dict = {}

    def go() -> None:
        try:
            box["r"] = launch.launch("tests.rank_hold", [], nprocs=nprocs, stream=False,
                                     timeout=240, out_dir=out)
        except Exception as e:  # noqa: BLE001 - reported below
            box["e"] = e

    t = threading.Thread(target=go)
    t.start()
    try:
        _wait_ready(out, 2)
        family = [os.getpid()] + [c.pid for c in psutil.Process().children(recursive=True)]
        listening = _listeners(family)
        assert listening, "no listening socket found: the check would pass vacuously"
        exposed = [x for x in listening if x[1] not in ("127.0.0.1", "::1")]
        assert not exposed, f"listening beyond loopback: {exposed} (all: {listening})"
    finally:
        (out / "release").touch()
        t.join(300)
    assert "e" not in box, box.get("e")


LAUNCHER = """
import sys
from helpers import launch
launch.launch("tests.rank_hold", [], nprocs=2, stream=False, timeout=600, out_dir=sys.argv[1])
"""


@pytest.mark.parametrize("how", ["killed", "ctrl-c"])
def test_ranks_end_within_seconds_when_their_launcher_dies(how, tmp_path):
    """The launching process (a kernel, in a notebook) is killed outright, or interrupted
    (Ctrl-C): its torchrun agent and ranks end within a few seconds, instead of retrying a dead
    rendezvous or training on."""
    out = tmp_path / "out"
    out.mkdir()
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    p = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(out)], env=env, cwd=root,
                         preexec_fn=interruptible)
    try:
        ranks = _wait_ready(out, 2)
        procs = psutil.Process(p.pid).children(recursive=True)  # the agent and its ranks
        assert {r.pid for r in procs} >= set(ranks) and len(procs) == 3, procs
        p.kill() if how == "killed" else p.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        gone, alive = psutil.wait_procs(procs, timeout=30)
        took = time.monotonic() - t0
        assert not alive, f"still running 30 s after their launcher was {how}: {alive}"
        print(f"agent and ranks ended {took:.2f} s after their launcher was {how}")
        assert took < 10, f"agent and ranks took {took:.1f} s to end after their launcher was {how}"
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        (out / "release").touch()


def test_stop_all_ends_the_process_tree_without_killpg(monkeypatch):
    """Windows has no os.killpg and no SIGKILL: the launcher ends the tree through psutil."""
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            " time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(p.pid).children() and time.monotonic() < deadline:
            time.sleep(0.1)
        (child,) = psutil.Process(p.pid).children()
        monkeypatch.delattr(os, "killpg")
        launch._stop_all([p], grace=0.5)
        assert p.poll() is not None
        child.wait(timeout=10)
        assert not child.is_running()
    finally:
        if p.poll() is None:
            p.kill()
