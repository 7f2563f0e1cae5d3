"""helpers.training: the plain loop learns, its switches do what they say, bad switches fail
clearly; checkpoints load anywhere; the memory a step needs is counted on every device."""

from __future__ import annotations

import io
import pickle

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
    return [(X[i : i + bs], y[i : i + bs]) for i in range(0, len(X), bs)]


def _mlp(d: int = 8, classes: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, classes))


def test_train_learns_and_reports_every_epoch_field():
    X, y = _blobs()
    data = _batches(X, y, 32)
    net = _mlp()
    hist = training.train(net, data, num_epochs=3, lr=0.2, device="cpu", progress=False)
    assert len(hist) == 3
    assert hist[-1].loss < hist[0].loss
    assert hist[-1].accuracy > 0.8 and training.evaluate(net, data, device="cpu")["accuracy"] > 0.8
    e = hist[-1]
    assert e.samples == 256 and e.optimizer_steps == 8 and e.epoch == 3
    assert e.samples_per_s > 0 and e.seconds > 0 and e.lr == 0.2


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
    hist = training.train(
        _mlp(), _batches(X, y, 16), device="cpu", steps_per_epoch=10, num_epochs=2, progress=False
    )
    assert [(e.samples, e.optimizer_steps) for e in hist] == [(160, 10), (160, 10)]


def test_lr_schedules_and_momentum():
    X, y = _blobs(n=64)
    data = _batches(X, y, 16)
    decay = training.train(
        _mlp(), data, device="cpu", lr=0.2, lr_schedule="linear-decay", num_epochs=2, progress=False
    )
    # the rate of each epoch's last update: steps 4 and 8 of 8, falling linearly from 0.2
    assert [e.lr for e in decay] == pytest.approx([0.2 * 5 / 8, 0.2 / 8])
    cycle = training.train(
        _mlp(),
        data,
        device="cpu",
        lr=0.2,
        lr_schedule="one-cycle",
        momentum=0.9,
        steps_per_epoch=12,
        progress=False,
    )
    assert cycle[-1].optimizer_steps == 12 and cycle[-1].lr < 0.2 / 100  # annealed to about 0
    assert cycle[-1].accuracy > 0.5
    with pytest.raises(ValueError, match="lr_schedule='one-cycle' needs the run's length"):
        training.train(
            _mlp(), (b for b in data), device="cpu", lr_schedule="one-cycle", progress=False
        )


# --- checkpoints ---------------------------------------------------------------------------


def test_module_prefix_fails_then_strips():
    net = nn.Linear(3, 2)
    sd = nn.DataParallel(net).state_dict()
    assert list(sd) == ["module.weight", "module.bias"]
    with pytest.raises(RuntimeError, match="Missing key"):
        nn.Linear(3, 2).load_state_dict(sd)
    fixed = training.strip_module_prefix(sd)
    assert list(fixed) == ["weight", "bias"] and "module.weight" in sd  # original untouched
    nn.Linear(3, 2).load_state_dict(fixed)
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        training.strip_module_prefix([1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the CPU-only failure")
def test_gpu_tagged_checkpoint_needs_map_location_on_cpu():
    buf = io.BytesIO()
    with training.saved_as_if_on("cuda:0"):
        torch.save(nn.Linear(3, 2).state_dict(), buf)
    buf.seek(0)
    with pytest.raises(RuntimeError, match="map_location"):
        torch.load(buf, weights_only=True)
    sd = training.load_weights(buf, map_location="cpu")
    assert sd["weight"].device.type == "cpu"
    buf2 = io.BytesIO()
    torch.save({"w": torch.ones(1)}, buf2)  # the tagger is gone again
    assert training.load_weights(buf2)["w"].item() == 1.0
    with pytest.raises(ValueError, match="CUDA location"):
        with training.saved_as_if_on("cpu"):
            pass


class _Evil:
    def __reduce__(self):
        return (print, ("this ran while loading",))


def test_weights_only_refuses_code_in_a_pickle():
    buf = io.BytesIO()
    torch.save({"w": torch.ones(1), "x": _Evil()}, buf)
    with pytest.raises(pickle.UnpicklingError):
        training.load_weights(buf)


# --- memory --------------------------------------------------------------------------------


def test_saved_tensors_are_alive_with_the_graph_and_freed_after_backward():
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    X = torch.randn(128, 64)
    with training.SavedTensors() as saved:
        loss = net(X).sum()
    assert saved.saved_bytes() >= 128 * 256 * 4  # at least one hidden activation
    assert saved.live_bytes() > 0
    loss.backward()
    del loss
    assert saved.live_bytes() < saved.saved_bytes() // 4


def test_a_kept_loss_keeps_the_graph_but_item_does_not():
    net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
    kept, scalars = [], []
    with training.SavedTensors() as saved:
        for _ in range(5):
            loss = net(torch.randn(64, 32)).pow(2).mean()
            kept.append(loss)
    grown = saved.live_bytes()
    with training.SavedTensors() as saved2:
        for _ in range(5):
            loss = net(torch.randn(64, 32)).pow(2).mean()
            scalars.append(loss.item())
    del loss
    assert grown > 5 * 64 * 128 * 4 * 0.9
    assert saved2.live_bytes() == 0


def test_peak_step_bytes_grows_with_batch_on_cpu():
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 16, 3)
    )
    y = torch.randint(0, 3, (64,))

    def step(n):
        return lambda: nn.functional.cross_entropy(net(torch.randn(n, 1, 4, 4)), y[:n]).backward()

    a, how = training.peak_step_bytes(step(8), "cpu")
    b, _ = training.peak_step_bytes(step(64), "cpu")
    activations_64 = 64 * 4 * 16 * 4  # one conv output of batch 64, float32
    assert b > a + 0.5 * activations_64 and "dispatch-mode" in how


def test_peak_tensor_bytes_sees_freed_and_kept_tensors():
    a = torch.randn(1024)  # made before the block: not counted
    with training.PeakTensorBytes() as m:
        b = a * 2  # 4 KiB alive
        c = b + 1  # 8 KiB alive at once
        del b, c  # freed
        d = a.repeat(4)  # 16 KiB
    assert m.peak == 16 * 1024 and m.current == 16 * 1024
    del d
    with training.PeakTensorBytes() as m2:
        for _ in range(10):
            e = a * 3  # each iteration frees the previous one
    assert m2.peak == 2 * 4096  # the new one exists before the old one is released
    del e


def test_peak_tensor_bytes_counts_no_view_or_update_of_a_tensor_made_before():
    lin = nn.Linear(256, 256)  # a 256 KiB weight, made before the block
    with training.PeakTensorBytes() as m:
        lin.weight.t()  # a view of the weight: no new memory
        with torch.no_grad():
            lin.weight.mul_(1.0)  # an optimizer-style in-place update: none either
        out = lin(torch.randn(4, 256))  # 4 KiB input + 4 KiB output, and views of the weight
    assert m.peak == 2 * 4 * 256 * 4, m.peak
    del out


def test_peak_step_bytes_shows_what_activation_checkpointing_saves():
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    blocks = nn.ModuleList(
        nn.Sequential(*[m for _ in range(3) for m in (nn.Linear(128, 128), nn.Tanh())])
        for _ in range(8)
    )
    X = torch.randn(2048, 128)

    def step(ckpt: bool):
        def run():
            x = X
            for b in blocks:
                x = checkpoint(b, x, use_reentrant=False) if ckpt else b(x)
            x.sum().backward()

        return run

    plain, how = training.peak_step_bytes(step(False), "cpu")
    ckpt, _ = training.peak_step_bytes(step(True), "cpu")
    assert "dispatch" in how
    # plain keeps 3 activations per block alive until backward; checkpointing keeps 1 per block
    # (its input) plus one block's worth while that block is recomputed
    assert plain > 1.5 * ckpt > 0


def test_calibration_step_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    before = [p.detach().clone() for p in net.parameters()]
    step = training.calibration_step(net, (4, 3, 2, 2), 3, "cpu")
    for _ in range(3):
        step()
    assert all(torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))
    assert all(p.grad is None for p in net.parameters())


def test_calibration_step_names_a_bad_class_count():
    with pytest.raises(ValueError, match="num_classes"):
        training.calibration_step(nn.Linear(2, 2), (4, 2), 1, "cpu")
