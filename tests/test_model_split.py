"""Model splitting: the split model computes what the whole model computes."""

from __future__ import annotations

import pytest
import torch

from helpers import model_split


def test_split_model_equals_the_unsplit_model():
    torch.manual_seed(0)
    enc, dec = model_split.encoder(16, 32, 2), model_split.decoder(32, 2)
    x = torch.randn(8, 16)
    whole = dec(enc(x))
    split = model_split.SplitModel(enc, dec, "cpu", "cpu")
    torch.testing.assert_close(split(x), whole)
    split(x).sum().backward()
    assert all(p.grad is not None for p in split.parameters())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_split_over_two_gpus():
    split = model_split.SplitModel(model_split.encoder(16, 32), model_split.decoder(32),
                                   "cuda:0", "cuda:1")
    assert split(torch.randn(4, 16)).device == torch.device("cuda:1")


@pytest.mark.parametrize("argv", [["--microbatches", "3"], ["--microbatches", "0"]])
def test_microbatches_must_divide_the_batch(argv):
    with pytest.raises(SystemExit):
        model_split.parse_args(["--batch", "8", *argv])


def test_pipeline_needs_two_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="2 stages"):
        model_split.main(["--out", str(tmp_path), "--backend", "gloo"])
