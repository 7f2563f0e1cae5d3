import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from helpers import launch, process_group


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
    monkeypatch.setenv("MASTER_PORT", str(launch.free_port()))
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
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(launch.free_port()),
               RANK="0", WORLD_SIZE="2")
    code = ("import torch; from helpers import process_group; "
            "process_group.init('gloo', device=torch.device('cpu'), init_timeout=3, timeout=600)")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert time.perf_counter() - t0 < 90  # 3 s plus interpreter start-up, far below the 600 s
    assert "timeout" in p.stderr.lower() or "timed out" in p.stderr.lower(), p.stderr[-2000:]


@pytest.mark.parametrize("kw", [dict(init_timeout=0), dict(init_timeout=5, timeout=-1)])
def test_init_rejects_bad_timeouts(kw):
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        process_group.init("gloo", device=torch.device("cpu"), **kw)
