import json
import time

import pytest
import torch

from helpers import data_wait, diagnose, models


@pytest.mark.parametrize("wait,busy,dev,kind", [
    (0.7, 0.2, "cpu", "input-bound"),
    (0.7, 0.9, "cuda", "input-bound"),
    (0.05, 0.9, "cuda", "gpu-bound"),
    (0.05, 0.2, "cuda", "launch-bound"),
    (0.05, 0.9, "cpu", "cpu-compute-bound"),
    (0.05, 0.2, "cpu", "python-bound"),
    (0.7, None, "mps", "input-bound"),
    (0.05, None, "mps", "not-input-bound"),
    (0.05, None, "xpu", "not-input-bound"),
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
    with pytest.raises(ValueError, match="busy_fraction must be in"):
        diagnose.classify(0.1, None, "cuda")  # measured there: a missing value is a bug


def test_unmeasured_accelerator_says_so_instead_of_guessing():
    kind, msg = diagnose.classify(0.05, None, "mps")
    assert kind == "not-input-bound" and "not measured" in msg and "MPS" in msg


@pytest.mark.parametrize("wait", [0.0, 0.05, data_wait.NOTICEABLE, 0.2, data_wait.INPUT_BOUND - 1e-9,
                                  data_wait.INPUT_BOUND, 0.9])
def test_one_input_bound_rule_for_the_meter_and_the_profile(wait):
    kind, sentence = data_wait.wait_verdict(wait)
    input_bound = wait >= data_wait.INPUT_BOUND
    assert (kind == "input-bound") == input_bound
    for dev in ("cpu", "cuda"):
        k, msg = diagnose.classify(wait, 0.5, dev)
        assert (k == "input-bound") == input_bound
        if input_bound:
            assert msg == sentence


def _slow_batches(n, delay):
    for _ in range(n):
        time.sleep(delay)  # a slow input pipeline: decoding, augmenting, reading
        yield torch.zeros(4, 8), torch.zeros(4, dtype=torch.long)


def _compute_bound(n_batches=6):
    torch.manual_seed(0)
    net = models.resnet18(width=4, in_channels=1)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    X, y = torch.randn(n_batches * 16, 1, 28, 28), torch.randint(0, 10, (n_batches * 16,))

    def step(batch):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(batch[0]), batch[1]).backward()
        opt.step()

    return step, list(zip(X.split(16), y.split(16), strict=True))


def test_data_bound_and_compute_bound_loops_are_told_apart(tmp_path):
    tiny = torch.nn.Linear(8, 2)
    d = diagnose.profile_loop(lambda b: tiny(b[0]).sum().backward(), _slow_batches(5, 0.05),
                              device="cpu", steps=3, trace_path=tmp_path / "t.json")
    assert d.kind == "input-bound", d.message
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    step, batches = _compute_bound()
    d = diagnose.profile_loop(step, batches, device="cpu", steps=2)
    assert d.kind == "cpu-compute-bound", d.message
    assert "Self CPU" in d.table


def test_profile_loop_bad_input():
    step, batches = _compute_bound(2)
    with pytest.raises(ValueError, match="profile_loop: steps must be an int >= 1, got 0"):
        diagnose.profile_loop(step, batches, device="cpu", steps=0)
    with pytest.raises(ValueError, match="ran out"):
        diagnose.profile_loop(step, batches, device="cpu", steps=5)
