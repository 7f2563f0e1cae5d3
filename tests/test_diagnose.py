import json

import pytest
import torch

from helpers import demo_loops, diagnose


@pytest.mark.parametrize("wait,busy,dev,kind", [
    (0.7, 0.2, "cpu", "input-bound"),
    (0.7, 0.9, "cuda", "input-bound"),
    (0.05, 0.9, "cuda", "gpu-bound"),
    (0.05, 0.2, "cuda", "launch-bound"),
    (0.05, 0.9, "cpu", "cpu-compute-bound"),
    (0.05, 0.2, "cpu", "python-bound"),
])
def test_classify_every_branch(wait, busy, dev, kind):
    k, msg = diagnose.classify(wait, busy, dev)
    assert k == kind
    assert "%" in msg


def test_classify_bad_input():
    with pytest.raises(ValueError, match="wait_fraction"):
        diagnose.classify(1.5, 0.1, "cpu")
    with pytest.raises(ValueError, match="device_type"):
        diagnose.classify(0.1, 0.1, "tpu")


def test_data_bound_and_compute_bound_loops_are_told_apart(tmp_path):
    torch.manual_seed(0)
    step, loader = demo_loops.data_bound_loop(96, 16)
    d = diagnose.profile_loop(step, loader, device="cpu", steps=3, trace_path=tmp_path / "t.json")
    assert d.kind == "input-bound", d.message
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    step, batches = demo_loops.compute_bound_loop(64, 16, width=4)
    d = diagnose.profile_loop(step, batches, device="cpu", steps=2)
    assert d.kind == "cpu-compute-bound", d.message
    assert "Self CPU" in d.table


def test_profile_loop_bad_input():
    step, batches = demo_loops.compute_bound_loop(32, 16, width=4)
    with pytest.raises(ValueError, match="steps"):
        diagnose.profile_loop(step, batches, device="cpu", steps=0)
    with pytest.raises(ValueError, match="ran out"):
        diagnose.profile_loop(step, batches, device="cpu", steps=5)


def test_device_busy_fraction_cpu():
    x = torch.randn(256, 256)
    frac = diagnose.device_busy_fraction(lambda: [x @ x for _ in range(10)], device="cpu")
    assert 0.3 < frac <= 1.0
