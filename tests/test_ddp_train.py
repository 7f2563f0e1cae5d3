"""The DDP training script's pieces, in one process (the multi-process runs are in test_launch)."""

from __future__ import annotations

import pytest
import torch

from helpers import ddp_train


def test_models():
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in ddp_train.build_model("mlp").modules())
    assert any(isinstance(m, torch.nn.BatchNorm1d) for m in ddp_train.build_model("mlp_bn").modules())
    with pytest.raises(ValueError, match="model must be one of"):
        ddp_train.build_model("resnet")


def test_dataset_is_the_same_in_every_process():
    a, b = ddp_train.make_dataset(64, seed=3), ddp_train.make_dataset(64, seed=3)
    assert torch.equal(a.tensors[0], b.tensors[0]) and torch.equal(a.tensors[1], b.tensors[1])
    assert not torch.equal(a.tensors[0], ddp_train.make_dataset(64, seed=4).tensors[0])


def test_ranks_split_each_epoch_without_overlap():
    ds = ddp_train.make_dataset(48, in_features=4)
    seen = []
    for r in range(3):
        loader, sampler = ddp_train.make_loader(ds, batch=4, world=3, rank=r, seed=0)
        sampler.set_epoch(1)
        seen.append({tuple(x.tolist()) for xb, _ in loader for x in xb})
    assert sum(len(s) for s in seen) == 48 and len(set.union(*seen)) == 48


def test_reference_training_learns_and_depends_on_world():
    kw = dict(steps_per_epoch=4, epochs=1, in_features=16, hidden=32, depth=2, batch=8)
    a = ddp_train.reference_train(world=2, **kw)
    b = ddp_train.reference_train(world=2, **kw)
    c = ddp_train.reference_train(world=1, **kw)
    assert ddp_train.checksum(a) == ddp_train.checksum(b)
    assert ddp_train.checksum(a) != ddp_train.checksum(c)


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--model", "cnn"], ["--epochs", "0"]])
def test_bad_arguments(argv):
    with pytest.raises(SystemExit):
        ddp_train.parse_args(argv)


def test_runs_alone_as_a_plain_script(tmp_path, monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    rc = ddp_train.main(["--in-features", "8", "--hidden", "16", "--depth", "1", "--batch", "4",
                         "--steps-per-epoch", "3", "--out", str(tmp_path), "--backend", "gloo"])
    assert rc == 0
    import json
    res = json.loads((tmp_path / "rank0.json").read_text())
    assert res["world"] == 1 and res["steps"] == 3 and res["samples_per_s"] > 0


def test_single_process_baseline_restores_threads():
    before = torch.get_num_threads()
    m = ddp_train.single_process_step_times(threads=1, batch=4, steps=2, in_features=8,
                                            hidden=8, depth=1)
    assert m.n == 2 and all(t > 0 for t in m.times) and m.median > 0
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads"):
        ddp_train.single_process_step_times(threads=0)
