"""helpers.device_augment.TensorBatches: every sample once per epoch, reshuffled, staged copies
that match plain indexing. (Notebook 03 asserts its batched crop/flip against the definition.)"""

from __future__ import annotations

import pytest
import torch

from helpers import device_augment as da


def batch(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)


def test_batches_cover_the_data_once_and_reshuffle_each_epoch():
    x = batch(50)
    y = torch.arange(50)
    b = da.TensorBatches(x, y, 16, augment=da.to_unit_float, device="cpu", seed=0)
    assert len(b) == 4
    seen = []
    for X, yb in b:
        assert X.dtype == torch.float32 and len(X) == len(yb) <= 16
        seen.append(yb)
    assert sorted(torch.cat(seen).tolist()) == list(range(50))
    second = torch.cat([yb for _, yb in b])
    assert sorted(second.tolist()) == list(range(50)) and not torch.equal(torch.cat(seen), second)
    # the same seed gives the same order, another seed another one
    order = [torch.cat([yb for _, yb in da.TensorBatches(x, y, 16, device="cpu", seed=s)]) for s in (0, 0, 1)]
    assert torch.equal(order[0], order[1]) and not torch.equal(order[0], order[2])
    assert torch.equal(order[0], torch.cat(seen))  # an epoch's order depends on the seed alone
    unshuffled = torch.cat([yb for _, yb in da.TensorBatches(x, y, 16, device="cpu", shuffle=False)])
    assert torch.equal(unshuffled, y)


def test_drop_last_gives_one_shape_but_never_no_batch():
    x, y = batch(50), torch.arange(50)
    b = da.TensorBatches(x, y, 16, device="cpu", drop_last=True)
    assert {len(xb) for xb, _ in b} == {16} and len(b) == 3
    small = da.TensorBatches(x[:10], y[:10], 16, device="cpu", drop_last=True)
    assert len(small) == 1 and [len(xb) for xb, _ in small] == [10]


@pytest.mark.parametrize("mode", ["memory", "device"])
def test_unit_float_gives_totensor_values(mode):
    x, y = batch(40), torch.arange(40)
    b = da.TensorBatches(x, y, 16, augment=da.to_unit_float, mode=mode, device="cpu", seed=2)
    for xb, yb in b:
        assert xb.dtype == torch.float32
        assert torch.equal(xb, torch.stack([torchvision_to_tensor(x[i]) for i in yb]))


def torchvision_to_tensor(img: torch.Tensor) -> torch.Tensor:
    from torchvision.transforms.functional import to_tensor

    return to_tensor(img.permute(1, 2, 0).numpy())


def test_staged_batches_match_plain_indexing_and_are_not_overwritten():
    # the pinned-buffer path (on a GPU) through unpinned buffers on the CPU: same numbers, and a
    # batch handed out is not changed by the buffer's reuse two batches later
    x, y = batch(96), torch.arange(96)
    kw = dict(augment=da.to_unit_float, mode="memory", device="cpu", seed=5)
    plain = da.TensorBatches(x, y, 20, staging=False, **kw)
    staged = da.TensorBatches(x, y, 20, staging=True, **kw)
    assert staged._bufs and not plain._bufs
    a, b = list(plain), list(staged)
    assert len(a) == len(b) == 5 and b[-1][0].shape[0] == 16  # the partial last batch too
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size=0), r"TensorBatches: batch_size must be an int >= 1, got 0"),
    (dict(y=torch.arange(3)), "one label per image"),
    (dict(x=batch(4).float()), "x must be a uint8 tensor of shape"),
    (dict(device="tpu"), "device must be"),
    (dict(mode="disk"), r"TensorBatches: mode must be one of 'device', 'memory', got 'disk'"),
])
def test_batches_bad_input(kwargs, match):
    args = dict(x=batch(4), y=torch.arange(4), batch_size=2, device="cpu") | kwargs
    with pytest.raises(ValueError, match=match):
        da.TensorBatches(args.pop("x"), args.pop("y"), args.pop("batch_size"), **args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: pinned staging buffers")
def test_staging_buffers_are_pinned_on_cuda():
    x, y = batch(64), torch.arange(64)
    b = da.TensorBatches(x, y, 32, augment=da.to_unit_float, mode="memory", device="cuda")
    assert all(buf[0].is_pinned() and buf[1].is_pinned() for buf in b._bufs)
    xs = torch.cat([xb.cpu() for xb, _ in b])
    assert torch.allclose(xs.sum(0), (x.float() / 255).sum(0), atol=1e-3)
