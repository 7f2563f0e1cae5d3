"""Checkpoint loading, host copies and the Boston-sized regression helpers."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from torch import nn

from helpers import checkpoints, regression, transfer


def test_module_prefix_fails_then_strips():
    net = nn.Linear(3, 2)
    sd = nn.DataParallel(net).state_dict()
    assert list(sd) == ["module.weight", "module.bias"]
    with pytest.raises(RuntimeError, match="Missing key"):
        nn.Linear(3, 2).load_state_dict(sd)
    fixed = checkpoints.strip_module_prefix(sd)
    assert list(fixed) == ["weight", "bias"] and "module.weight" in sd  # original untouched
    nn.Linear(3, 2).load_state_dict(fixed)
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        checkpoints.strip_module_prefix([1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the CPU-only failure")
def test_gpu_tagged_checkpoint_needs_map_location_on_cpu():
    buf = io.BytesIO()
    with checkpoints.saved_as_if_on("cuda:0"):
        torch.save(nn.Linear(3, 2).state_dict(), buf)
    buf.seek(0)
    with pytest.raises(RuntimeError, match="map_location"):
        torch.load(buf, weights_only=True)
    sd = checkpoints.load_weights(buf, map_location="cpu")
    assert sd["weight"].device.type == "cpu"
    buf2 = io.BytesIO()
    torch.save({"w": torch.ones(1)}, buf2)  # the tagger is gone again
    assert checkpoints.load_weights(buf2)["w"].item() == 1.0
    with pytest.raises(ValueError, match="CUDA location"):
        with checkpoints.saved_as_if_on("cpu"):
            pass


class _Evil:
    def __reduce__(self):
        return (print, ("this ran while loading",))


def test_weights_only_refuses_code_in_a_pickle():
    buf = io.BytesIO()
    torch.save({"w": torch.ones(1), "x": _Evil()}, buf)
    with pytest.raises(pickle.UnpicklingError):
        checkpoints.load_weights(buf)


def test_copy_time_on_cpu_and_pinned_needs_cuda():
    m = transfer.copy_time(1 << 16, "cpu", repeats=2)
    assert m.median > 0 and transfer.gb_per_s(1 << 16, m) > 0
    with pytest.raises(ValueError, match="nbytes"):
        transfer.host_tensor(0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pinned=True needs CUDA"):
            transfer.host_tensor(64, pinned=True)


def test_boston_like_and_fit():
    X, y = regression.boston_like()
    assert X.shape == (506, 13) and y.shape == (506, 1)
    assert abs(float(y.mean())) < 1e-5
    res = regression.fit(X, y, "cpu", steps=50)
    assert res["rows"] == 506 and res["seconds"] > 0 and res["mse"] < 0.5  # it learned
    with pytest.raises(ValueError, match="n must be an int >= 2"):
        regression.boston_like(n=1)
    with pytest.raises(ValueError, match="steps must be"):
        regression.fit(X, y, "cpu", steps=0)
