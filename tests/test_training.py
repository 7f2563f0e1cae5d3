"""The plain training loop: it learns, its switches do what they say, bad switches fail clearly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import training


def _blobs(n: int = 256, d: int = 8, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, d, generator=g) * 3
    y = torch.randint(0, classes, (n,), generator=g)
    X = centers[y] + torch.randn(n, d, generator=g)
    return X, y


def _batches(X, y, bs):
    return [(X[i:i + bs], y[i:i + bs]) for i in range(0, len(X), bs)]


def _mlp(d: int = 8, classes: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, classes))


def test_train_learns_and_reports_every_epoch_field():
    X, y = _blobs()
    data = _batches(X, y, 32)
    net = _mlp()
    hist = training.train(net, data, num_epochs=3, lr=0.2, device="cpu", progress=False)
    assert len(hist.epochs) == 3
    assert hist["loss"][-1] < hist["loss"][0]
    assert hist.last.accuracy > 0.8 and training.evaluate(net, data, device="cpu")["accuracy"] > 0.8
    e = hist.last
    assert e.samples == 256 and e.optimizer_steps == 8 and e.epoch == 3
    assert e.samples_per_s > 0 and e.seconds > 0 and e.lr == 0.2
    with pytest.raises(KeyError, match="columns are"):
        hist["nope"]
    with pytest.raises(IndexError, match="no epoch"):
        _ = training.History().last


def test_evaluate_matches_a_manual_computation():
    X, y = _blobs(n=100)
    net = _mlp()
    res = training.evaluate(net, _batches(X, y, 30), device="cpu")
    with torch.no_grad():
        out = net(X)
    assert res["samples"] == 100
    assert res["accuracy"] == pytest.approx((out.argmax(1) == y).float().mean().item())
    assert res["loss"] == pytest.approx(nn.functional.cross_entropy(out, y).item(), rel=1e-5)
    assert net.training  # mode restored


def test_one_epoch_is_plain_sgd_on_each_batch():
    X, y = _blobs(n=64)
    data = _batches(X, y, 16)
    net, ref = _mlp(), _mlp()
    training.train(net, data, lr=0.1, device="cpu", progress=False)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for Xb, yb in data:
        nn.functional.cross_entropy(ref(Xb), yb).backward()
        opt.step()
        opt.zero_grad()
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_epochs": 0}, "train: num_epochs must be an int >= 1"),
        ({"steps_per_epoch": 0}, "train: steps_per_epoch must be an int >= 1"),
        ({"lr": 0}, "train: lr must be a positive finite number"),
        ({"momentum": -0.5}, "train: momentum must be a finite number >= 0"),
        ({"lr_schedule": "cosine"}, "train: lr_schedule must be one of 'constant', 'linear-decay'"),
        ({"device": "tpu"}, "device must be"),
    ],
)
def test_bad_switches_give_clear_errors(kwargs, match):
    X, y = _blobs(n=16)
    with pytest.raises(ValueError, match=match):
        training.train(_mlp(), [(X, y)], progress=False, **{"device": "cpu", **kwargs})


def test_bad_data_gives_clear_errors():
    with pytest.raises(ValueError, match=r"\(X, y\) pairs"):
        training.train(_mlp(), [torch.zeros(4, 8)], device="cpu", progress=False)
    with pytest.raises(ValueError, match="iterable of"):
        training.train(_mlp(), torch.zeros(4, 8), device="cpu", progress=False)
    with pytest.raises(ValueError, match="no batches"):
        training.train(_mlp(), [], device="cpu", progress=False)
    X, y = _blobs(n=16)
    gen = (b for b in [(X, y)])
    with pytest.raises(ValueError, match="generator can only be iterated once"):
        training.train(_mlp(), gen, device="cpu", num_epochs=2, progress=False)


def test_steps_per_epoch_goes_round_a_short_train_iter():
    X, y = _blobs(n=64)
    hist = training.train(_mlp(), _batches(X, y, 16), device="cpu", steps_per_epoch=10,
                          num_epochs=2, progress=False)
    assert hist["samples"] == [160, 160] and hist["optimizer_steps"] == [10, 10]


def test_lr_schedules_and_momentum():
    X, y = _blobs(n=64)
    data = _batches(X, y, 16)
    decay = training.train(_mlp(), data, device="cpu", lr=0.2, lr_schedule="linear-decay",
                           num_epochs=2, progress=False)
    # the rate of each epoch's last update: steps 4 and 8 of 8, falling linearly from 0.2
    assert decay["lr"] == pytest.approx([0.2 * 5 / 8, 0.2 / 8])
    cycle = training.train(_mlp(), data, device="cpu", lr=0.2, lr_schedule="one-cycle",
                           momentum=0.9, steps_per_epoch=12, progress=False)
    assert cycle.last.optimizer_steps == 12 and cycle.last.lr < 0.2 / 100  # annealed to about 0
    assert cycle.last.accuracy > 0.5
    with pytest.raises(ValueError, match="lr_schedule='one-cycle' needs the run's length"):
        training.train(_mlp(), (b for b in data), device="cpu", lr_schedule="one-cycle",
                       progress=False)
