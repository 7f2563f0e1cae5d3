"""The shared training loop: it learns, its switches do what they say, bad switches fail clearly."""

from __future__ import annotations

import copy
import warnings

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
    hist = training.train(net, data, num_epochs=3, lr=0.2, device="cpu", progress=False,
                          test_iter=data)
    assert len(hist.epochs) == 3
    assert hist["loss"][-1] < hist["loss"][0]
    assert hist.last.accuracy > 0.8 and hist.last.test_accuracy > 0.8
    e = hist.last
    assert e.samples == 256 and e.optimizer_steps == 8
    assert e.samples_per_s > 0 and e.seconds > 0
    assert 0 <= e.data_wait_fraction <= 1 and e.data_wait_s >= 0
    assert e.peak_memory_bytes > 0 and "RSS" in e.memory_kind
    assert hist.config["precision"] == "fp32"
    with pytest.raises(KeyError, match="columns are"):
        hist["nope"]


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


def test_accumulation_gives_the_same_update_as_one_big_batch():
    X, y = _blobs(n=64)
    net_a, net_b = _mlp(seed=1), _mlp(seed=1)
    training.train(net_a, [(X, y)], lr=0.1, device="cpu", progress=False)
    hist = training.train(net_b, _batches(X, y, 16), lr=0.1, device="cpu", accum_steps=4,
                          progress=False)
    assert hist.last.optimizer_steps == 1
    for pa, pb in zip(net_a.parameters(), net_b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_accumulation_steps_a_left_over_partial_group():
    X, y = _blobs(n=80)
    hist = training.train(_mlp(), _batches(X, y, 16), device="cpu", accum_steps=2, progress=False)
    assert hist.last.optimizer_steps == 3  # 5 micro-batches: 2 + 2 + 1 left over


def test_log_every_logs_k_step_means_and_steps_per_epoch_caps():
    X, y = _blobs(n=320)
    hist = training.train(_mlp(), _batches(X, y, 32), device="cpu", log_every=3,
                          steps_per_epoch=7, num_epochs=2, progress=False)
    assert [s for s, _ in hist.steps] == [3, 6, 10, 13]
    assert hist.last.samples == 7 * 32
    assert all(v > 0 for _, v in hist.steps)


def test_bf16_and_channels_last_run_and_stay_close_to_fp32():
    torch.manual_seed(0)
    X = torch.randn(16, 3, 8, 8)
    y = torch.randint(0, 4, (16,))
    base = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, 4))
    nets = {k: copy.deepcopy(base) for k in ("fp32", "bf16", "cl")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h32 = training.train(nets["fp32"], [(X, y)], device="cpu", progress=False)
        h16 = training.train(nets["bf16"], [(X, y)], device="cpu", precision="bf16", progress=False)
        hcl = training.train(nets["cl"], [(X, y)], device="cpu", channels_last=True, progress=False)
    assert h16.config["precision"] == "bf16"
    assert h16.last.loss == pytest.approx(h32.last.loss, rel=0.05)
    assert hcl.last.loss == pytest.approx(h32.last.loss, rel=1e-4)
    assert nets["cl"][0].weight.is_contiguous(memory_format=torch.channels_last)


def test_fp16_on_cpu_warns_and_falls_back_to_fp32():
    X, y = _blobs(n=32)
    with pytest.warns(UserWarning, match="falls back to fp32"):
        hist = training.train(_mlp(), [(X, y)], device="cpu", precision="fp16", progress=False)
    assert hist.config["precision"] == "fp32" and hist.config["precision_requested"] == "fp16"


def test_resolve_precision_plans():
    assert training.resolve_precision("FP32", "cpu").autocast_dtype is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = training.resolve_precision("bf16", "cpu")
    assert plan.autocast_dtype is torch.bfloat16 and not plan.use_scaler


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"precision": "fp8"}, "precision must be one of 'fp32', 'fp16', 'bf16', got 'fp8'"),
        ({"precision": 16}, "precision must be one of"),
        ({"accum_steps": 0}, "train: accum_steps must be an int >= 1, got 0"),
        ({"accum_steps": 1.5}, "train: accum_steps must be an int >= 1"),
        ({"num_epochs": 0}, "train: num_epochs must be an int >= 1"),
        ({"log_every": -1}, "train: log_every must be an int >= 0"),
        ({"steps_per_epoch": 0}, "train: steps_per_epoch must be an int >= 1"),
        ({"lr": 0}, "train: lr must be a positive finite number"),
        ({"momentum": -0.5}, "train: momentum must be a finite number >= 0"),
        ({"lr_schedule": "cosine"}, "train: lr_schedule must be one of 'constant', 'linear-decay'"),
        ({"device": "tpu"}, "device must be"),
        ({"compile_model": "yes"}, "compile_model must be"),
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


def test_lr_schedules_momentum_and_fused():
    X, y = _blobs(n=64)
    data = _batches(X, y, 16)
    decay = training.train(_mlp(), data, device="cpu", lr=0.2, lr_schedule="linear-decay",
                           num_epochs=2, progress=False)
    # the rate of each epoch's last update: steps 4 and 8 of 8, falling linearly from 0.2
    assert decay["lr"] == pytest.approx([0.2 * 5 / 8, 0.2 / 8])
    cycle = training.train(_mlp(), data, device="cpu", lr=0.2, lr_schedule="one-cycle",
                           momentum=0.9, steps_per_epoch=12, accum_steps=2, progress=False)
    assert cycle.last.optimizer_steps == 6 and cycle.last.lr < 0.2 / 1000  # annealed to about 0
    assert cycle.config["momentum"] == 0.9 and cycle.last.accuracy > 0.5
    with pytest.raises(ValueError, match="lr_schedule='one-cycle' needs the run's length"):
        training.train(_mlp(), (b for b in data), device="cpu", lr_schedule="one-cycle",
                       progress=False)
    fused = training.train(_mlp(), data, device="cpu", fused=True, progress=False, num_epochs=3)
    assert fused.config["fused"] is True and fused["loss"][-1] < fused["loss"][0]


def test_a_scaled_step_makes_the_same_update_as_a_plain_one():
    X, y = _blobs(n=32)
    plan = training.resolve_precision("fp32", "cpu")
    nets, grads = [_mlp(seed=2), _mlp(seed=2)], []
    for net, scaler in zip(nets, (None, torch.amp.GradScaler("cpu", init_scale=2.0**16)), strict=True):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        out, loss = training.forward_backward(net, X, y, plan, scaler, accum_steps=2)
        assert out.shape == (32, 3) and loss.item() > 0
        grads.append(net[0].weight.grad.abs().max().item())
        training.optimizer_step(opt, scaler)
        assert all(p.grad is None for p in net.parameters())
    assert grads[1] > 1000 * grads[0]  # scaled gradients, until the step unscales them
    for pa, pb in zip(*(n.parameters() for n in nets), strict=True):
        torch.testing.assert_close(pa, pb)


def test_compile_switch_with_the_eager_backend():
    X, y = _blobs(n=32)
    hist = training.train(_mlp(), [(X, y)], device="cpu", compile_model={"backend": "eager"},
                          progress=False)
    assert hist.config["compile"] is True and hist.last.loss > 0


@pytest.mark.parametrize("switch,compiles", [({}, True), (True, True), (False, False)])
def test_an_empty_dict_compiles_with_the_default_options(monkeypatch, switch, compiles):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda net, **kw: calls.append(kw) or net)
    X, y = _blobs(n=32)
    hist = training.train(_mlp(), [(X, y)], device="cpu", compile_model=switch, progress=False)
    assert (calls == [{}]) == compiles and hist.config["compile"] is compiles


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_on_gpu_uses_a_scaler_and_measures_cuda_memory():
    X, y = _blobs(n=64)
    hist = training.train(_mlp(), _batches(X, y, 16), device="cuda", precision="fp16",
                          progress=False)
    assert hist.config["precision"] == "fp16"
    assert hist.last.memory_kind.startswith("cuda") and hist.last.peak_memory_bytes > 0


def test_on_step_is_called_after_every_micro_batch():
    net = nn.Linear(4, 3)
    data = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(5)]
    seen = []
    training.train(net, data, num_epochs=2, device="cpu", progress=False, on_step=seen.append)
    assert seen == list(range(1, 11))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: fp16 with a GradScaler")
def test_fp16_scaler_path_uses_fused_sgd_without_a_sync_per_step():
    net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    data = [(torch.randn(8, 16, device="cuda"), torch.randint(0, 3, (8,), device="cuda")) for _ in range(4)]
    h = training.train(net, data, device="cuda", precision="fp16", progress=False)
    assert h.config["fused"] is True and h.config["precision"] == "fp16"
    assert training.train(nn.Linear(16, 3), data, device="cuda", progress=False).config["fused"] is False
