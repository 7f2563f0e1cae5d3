"""Counting what autograd keeps alive (the CPU stand-in for cuda.memory_allocated)."""

from __future__ import annotations

import torch
from torch import nn

from helpers import memory


def test_saved_tensors_are_alive_with_the_graph_and_freed_after_backward():
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    X = torch.randn(128, 64)
    with memory.SavedTensors() as saved:
        loss = net(X).sum()
    assert saved.saved_bytes() >= 128 * 256 * 4  # at least one hidden activation
    assert saved.live_bytes() > 0
    loss.backward()
    del loss
    assert saved.live_bytes() < saved.saved_bytes() // 4


def test_a_kept_loss_keeps_the_graph_but_item_does_not():
    net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
    kept, scalars = [], []
    with memory.SavedTensors() as saved:
        for _ in range(5):
            loss = net(torch.randn(64, 32)).pow(2).mean()
            kept.append(loss)
    grown = saved.live_bytes()
    with memory.SavedTensors() as saved2:
        for _ in range(5):
            loss = net(torch.randn(64, 32)).pow(2).mean()
            scalars.append(loss.item())
    del loss
    assert grown > 5 * 64 * 128 * 4 * 0.9
    assert saved2.live_bytes() == 0


def test_peak_step_bytes_grows_with_batch_on_cpu():
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 16, 3))
    y = torch.randint(0, 3, (64,))

    def step(n):
        return lambda: nn.functional.cross_entropy(net(torch.randn(n, 1, 4, 4)), y[:n]).backward()

    a, how = memory.peak_step_bytes(step(8), "cpu")
    b, _ = memory.peak_step_bytes(step(64), "cpu")
    activations_64 = 64 * 4 * 16 * 4  # one conv output of batch 64, float32
    assert b > a + 0.5 * activations_64 and "dispatch-mode" in how


def test_peak_tensor_bytes_sees_freed_and_kept_tensors():
    a = torch.randn(1024)  # made before the block: not counted
    with memory.PeakTensorBytes() as m:
        b = a * 2                 # 4 KiB alive
        c = b + 1                 # 8 KiB alive at once
        del b, c                  # freed
        d = a.repeat(4)           # 16 KiB
    assert m.peak == 16 * 1024 and m.current == 16 * 1024
    del d
    with memory.PeakTensorBytes() as m2:
        for _ in range(10):
            e = a * 3             # each iteration frees the previous one
    assert m2.peak == 2 * 4096    # the new one exists before the old one is released
    del e


def test_peak_step_bytes_shows_what_activation_checkpointing_saves():
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(*[m for _ in range(3) for m in (nn.Linear(128, 128), nn.Tanh())])
                           for _ in range(8))
    X = torch.randn(2048, 128)

    def step(ckpt: bool):
        def run():
            x = X
            for b in blocks:
                x = checkpoint(b, x, use_reentrant=False) if ckpt else b(x)
            x.sum().backward()
        return run

    plain, how = memory.peak_step_bytes(step(False), "cpu")
    ckpt, _ = memory.peak_step_bytes(step(True), "cpu")
    assert "dispatch" in how
    # plain keeps 3 activations per block alive until backward; checkpointing keeps 1 per block
    # (its input) plus one block's worth while that block is recomputed
    assert plain > 1.5 * ckpt > 0
