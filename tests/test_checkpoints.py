"""Checkpoint loading: the `module.` prefix, `map_location`, `weights_only`."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from torch import nn

from helpers import checkpoints


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
