"""no_sync accumulation and sharded data parallel, in two real gloo processes."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import ddp_lessons, launch


def _flat(params: list[list[float]]) -> np.ndarray:
    return np.concatenate([np.asarray(p) for p in params])


def test_bad_arguments_name_the_parameter():
    with pytest.raises(SystemExit):
        ddp_lessons.parse_args(["--lesson", "no_sync", "--accum", "0"])
    with pytest.raises(SystemExit):
        ddp_lessons.parse_args(["--lesson", "shard", "--steps", "1"])
    with pytest.raises(SystemExit):
        ddp_lessons.parse_args(["--lesson", "pipeline"])


def test_no_sync_all_reduces_once_per_step_with_the_same_weights():
    accum, steps = 3, 3
    r = launch.launch("helpers.ddp_lessons", ["--lesson", "no_sync", "--accum", accum, "--steps", steps,
                                              "--hidden", 64, "--depth", 2],
                      nprocs=2, timeout=120, stream=False)
    for rank in (0, 1):
        every, ns = r.results[rank]["every_micro_batch"], r.results[rank]["no_sync"]
        assert every["allreduces"] == accum * ns["allreduces"] > 0
        assert every["bytes"] == accum * ns["bytes"]
        assert np.allclose(_flat(every["params"]), _flat(ns["params"]), atol=1e-6)
    # and the two replicas agree with each other
    assert np.array_equal(_flat(r.results[0]["no_sync"]["params"]), _flat(r.results[1]["no_sync"]["params"]))


def test_sharding_halves_what_each_rank_holds_and_trains_the_same_model():
    r = launch.launch("helpers.ddp_lessons", ["--lesson", "both", "--steps", 3, "--hidden", 64, "--depth", 2],
                      nprocs=2, timeout=180, stream=False)
    assert "no_sync" in r.results[0]  # --lesson both ran the accumulation lesson too
    for rank in (0, 1):
        res = r.results[rank]
        ddp, zero = res["ddp"], res["zero"]
        assert ddp["optimizer_bytes"] == 2 * ddp["param_bytes"]  # Adam: two moments per weight
        assert zero["param_bytes"] == ddp["param_bytes"] and zero["optimizer_bytes"] < ddp["optimizer_bytes"]
        assert np.allclose(_flat(zero["params"]), _flat(ddp["params"]), atol=1e-5)
        fsdp = res["fsdp2"]
        if "error" in fsdp:
            pytest.skip(f"FSDP2 unavailable with this backend: {fsdp['error']}")
        for key in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            assert fsdp[key] <= ddp[key] // 2 + 1024, key
        assert np.allclose(_flat(fsdp["params"]), _flat(ddp["params"]), atol=1e-5)
        assert np.allclose(fsdp["losses"], ddp["losses"], rtol=1e-4)
    # ZeRO splits the optimizer state between the ranks: together they hold one copy
    total = sum(r.results[k]["zero"]["optimizer_bytes"] for k in (0, 1))
    assert total == r.results[0]["ddp"]["optimizer_bytes"]
