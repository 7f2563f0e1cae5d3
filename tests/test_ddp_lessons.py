"""Notebook 16's no_sync script (its `%%writefile {NOSYNC_PY}` cell) and notebook 18's sharding
script (its `%%writefile {SHARD_PY}` cell), each in two real gloo processes."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import launch
from tests.notebook_scripts import write_script

pytestmark = pytest.mark.slow  # trains with two ranks


def _flat(params: list[list[float]]) -> np.ndarray:
    return np.concatenate([np.asarray(p) for p in params])


def test_no_sync_all_reduces_once_per_step_to_the_same_weights(tmp_path):
    script = write_script("16_ddp.ipynb", "NOSYNC_PY", tmp_path / "no_sync.py")
    accum = 3
    r = launch.run(
        script,
        ["--accum", accum, "--steps", 3, "--hidden", 64],
        nprocs=2,
        stream=False,
        timeout=240,
    )
    for rank in (0, 1):
        every, ns = r.results[rank]["every_micro_batch"], r.results[rank]["no_sync"]
        assert every["allreduces"] == accum * ns["allreduces"] > 0
        assert every["bytes"] == accum * ns["bytes"]
        assert np.allclose(_flat(every["params"]), _flat(ns["params"]), atol=1e-6)
    assert np.array_equal(
        _flat(r.results[0]["no_sync"]["params"]), _flat(r.results[1]["no_sync"]["params"])
    )


def test_sharding_splits_what_each_rank_holds_and_trains_the_same_weights(tmp_path):
    script = write_script(
        "18_many_machines_and_sharding.ipynb", "SHARD_PY", tmp_path / "sharded.py"
    )
    r = launch.run(script, ["--steps", 3, "--hidden", 64], nprocs=2, stream=False, timeout=240)
    for rank in (0, 1):
        res = r.results[rank]
        ddp, zero = res["ddp"], res["zero"]
        assert ddp["optimizer_bytes"] == 2 * ddp["param_bytes"]  # Adam: two moments per weight
        assert (
            zero["param_bytes"] == ddp["param_bytes"]
            and zero["optimizer_bytes"] < ddp["optimizer_bytes"]
        )
        assert np.allclose(_flat(zero["params"]), _flat(ddp["params"]), atol=1e-5)
    # ZeRO splits the optimizer state between the ranks: together they hold one copy
    assert (
        sum(r.results[k]["zero"]["optimizer_bytes"] for k in (0, 1))
        == r.results[0]["ddp"]["optimizer_bytes"]
    )
    for rank in (0, 1):
        fsdp, ddp = r.results[rank]["fsdp2"], r.results[rank]["ddp"]
        if "error" in fsdp:
            pytest.skip(f"FSDP2 unavailable with this backend: {fsdp['error']}")
        for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            assert fsdp[key] <= ddp[key] // 2 + 1024, key
        assert np.allclose(_flat(fsdp["params"]), _flat(ddp["params"]), atol=1e-5)
        assert np.allclose(fsdp["losses"], ddp["losses"], rtol=1e-4)
