"""helpers.device_augment: batched pad/crop/flip/normalise, checked against the definition."""

from __future__ import annotations

import pytest
import torch

from helpers import device_augment as da
from helpers import pipelines


def batch(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)


def test_every_output_is_a_crop_of_its_own_input():
    x = batch(32)
    aug = da.DeviceAugment(pad=4, crop=32, flip=True, seed=3)
    out = aug(x)
    assert out.shape == (32, 3, 32, 32) and out.dtype == torch.float32
    found = [da.find_crop(out[i], x[i], aug) for i in range(len(x))]
    assert all(f is not None for f in found)
    assert len({f[:2] for f in found}) > 5          # per-sample offsets
    assert {f[2] for f in found} == {True, False}   # per-sample flips


def test_find_crop_rejects_a_wrong_image():
    x = batch(2)
    aug = da.DeviceAugment(seed=0)
    out = aug(x)
    assert da.find_crop(out[0], x[1], aug) is None


def test_no_augmentation_is_plain_normalisation():
    x = batch(4)
    aug = da.DeviceAugment(pad=0, crop=32, flip=False, mean=pipelines.CIFAR_MEAN, std=pipelines.CIFAR_STD)
    mean = torch.tensor(pipelines.CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(pipelines.CIFAR_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(aug(x), (x.float() / 255 - mean) / std, atol=1e-5, rtol=1e-5)
    raw = da.DeviceAugment(pad=0, crop=32, flip=False, mean=None, std=None)(x)
    torch.testing.assert_close(raw, x.float() / 255)


def test_matches_torchvision_for_the_same_crop():
    # torchvision's RandomCrop(32, padding=4) then flip, at the offsets DeviceAugment drew
    from torchvision.transforms.v2 import functional as TF
    x = batch(6)
    aug = da.DeviceAugment(pad=4, crop=32, flip=True, mean=None, std=None, seed=5)
    out = aug(x)
    for i in range(len(x)):
        dy, dx, flipped = da.find_crop(out[i], x[i], aug)
        ref = TF.crop(TF.pad(x[i], [4]), dy, dx, 32, 32)
        if flipped:
            ref = TF.horizontal_flip(ref)
        torch.testing.assert_close(out[i], ref.float() / 255)


def test_seeded_and_reproducible():
    x = batch(16)
    assert torch.equal(da.DeviceAugment(seed=1)(x), da.DeviceAugment(seed=1)(x))
    assert not torch.equal(da.DeviceAugment(seed=1)(x), da.DeviceAugment(seed=2)(x))


def test_smaller_crop():
    out = da.DeviceAugment(pad=0, crop=24, flip=True)(batch(5))
    assert out.shape == (5, 3, 24, 24)


@pytest.mark.parametrize("kwargs, match", [
    (dict(pad=-1), "pad must be an int >= 0"),
    (dict(crop=0), "crop must be an int >= 1"),
    (dict(mean=(0.5,) * 3, std=None), "both mean and std"),
    (dict(std=(0.0, 1.0, 1.0)), "std must be positive"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        da.DeviceAugment(**kwargs)


def test_bad_batches():
    aug = da.DeviceAugment()
    with pytest.raises(ValueError, match="uint8 tensor of shape"):
        aug(batch(2).float())
    with pytest.raises(ValueError, match="larger than the padded image"):
        da.DeviceAugment(pad=0, crop=40)(batch(2))
    with pytest.raises(ValueError, match="channels"):
        aug(torch.zeros(2, 1, 32, 32, dtype=torch.uint8))


def test_batches_cover_the_data_once_and_reshuffle_each_epoch():
    x = batch(50)
    y = torch.arange(50)
    b = da.TensorBatches(x, y, 16, augment=da.DeviceAugment(), device="cpu", seed=0)
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_gpu_same_definition():
    x = batch(16).cuda()
    aug = da.DeviceAugment(seed=0)
    out = aug(x)
    assert out.is_cuda
    assert all(da.find_crop(out[i], x[i], aug) is not None for i in range(16))
