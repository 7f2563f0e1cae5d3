import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import process_group


def test_p2p_fallback_disables_nccl_p2p_only_when_a_pair_lacks_peer_access():
    env: dict[str, str] = {}
    assert process_group.p2p_fallback(4, can_access=lambda i, j: True, env=env) is None and env == {}
    note = process_group.p2p_fallback(3, can_access=lambda i, j: {i, j} != {1, 2}, env=env)
    assert env == {"NCCL_P2P_DISABLE": "1"} and "GPU 1 cannot access GPU 2" in note
    user = {"NCCL_P2P_DISABLE": "0"}  # the user's own setting wins
    assert process_group.p2p_fallback(2, can_access=lambda i, j: False, env=user) is None
    assert user == {"NCCL_P2P_DISABLE": "0"}
    assert process_group.p2p_fallback(1, can_access=lambda i, j: False, env=env) is None


def test_init_uses_the_collective_timeout_after_the_rendezvous(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")  # a group of one: the OS picks the store's port
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    process_group.init("gloo", device=torch.device("cpu"), init_timeout=5, timeout=123)
    try:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        assert backend.options._timeout.total_seconds() == 123  # not the 5 s of the rendezvous
        process_group.barrier(torch.device("cpu"))
    finally:
        dist.destroy_process_group()


def test_a_missing_rank_fails_the_rendezvous_within_the_init_timeout():
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="2")
    code = ("import torch; from helpers import process_group; "
            "process_group.init('gloo', device=torch.device('cpu'), init_timeout=3, timeout=600)")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert time.perf_counter() - t0 < 90  # 3 s plus interpreter start-up, far below the 600 s
    assert "timeout" in p.stderr.lower() or "timed out" in p.stderr.lower(), p.stderr[-2000:]


@pytest.mark.parametrize("kw", [dict(init_timeout=0), dict(init_timeout=5, timeout=-1)])
def test_init_rejects_bad_timeouts(kw):
    with pytest.raises(ValueError, match="timeout must be a positive finite number of seconds"):
        process_group.init("gloo", device=torch.device("cpu"), **kw)


def test_auto_backend_is_one_rule_for_launcher_and_ranks(monkeypatch):
    gpus = torch.cuda.device_count()
    nccl = dist.is_nccl_available()
    for procs in (1, 2, 3):  # e.g. 3 processes on 2 GPUs: every rank picks gloo, none nccl
        want = "nccl" if nccl and gpus >= procs else "gloo"
        assert process_group.resolve_backend("auto", procs) == want
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert process_group.resolve_backend("auto", 3) == "gloo"
    with pytest.raises(ValueError, match="one process per GPU"):
        process_group.resolve_backend("nccl", 3)
    with pytest.raises(ValueError, match="backend must be one of"):
        process_group.resolve_backend("mpi", 1)


def test_setup_alone_is_a_group_of_one_without_a_socket(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    before = torch.get_num_threads()
    with process_group.setup("gloo", threads=1, init_timeout=5) as (backend, device):
        assert (backend, device, dist.get_world_size()) == ("gloo", torch.device("cpu"), 1)
        assert torch.get_num_threads() == 1
    assert not dist.is_initialized()
    torch.set_num_threads(before)


def test_record_names_the_rank_and_time_in_torchruns_error_file(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    monkeypatch.setenv("RANK", "3")

    @process_group.record
    def main() -> int:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        main()
    info = json.loads((tmp_path / "error.json").read_text())["message"]["extraInfo"]
    assert info["rank"] == "3" and "RuntimeError: boom" in info["py_callstack"]
    assert abs(float(info["time"]) - time.time()) < 60 and float(info["time"]) % 1  # sub-second


def test_exit_rank_flushes_output_and_keeps_the_exit_code():
    code = ("import sys; from helpers.process_group import exit_rank; print('done', end=''); "
            "print('warn', end='', file=sys.stderr); exit_rank(3)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert (p.returncode, p.stdout, p.stderr.strip().endswith("warn")) == (3, "done", True)
