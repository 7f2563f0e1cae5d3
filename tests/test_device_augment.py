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


def test_device_batches_cover_the_data_once():
    x = batch(50)
    y = torch.arange(50)
    seen = []
    for X, yb in da.device_batches(x, y, 16, da.DeviceAugment(), "cpu", shuffle=True, seed=0):
        assert X.dtype == torch.float32 and len(X) == len(yb) <= 16
        seen.append(yb)
    assert sorted(torch.cat(seen).tolist()) == list(range(50))
    order = [torch.cat([b for _, b in da.device_batches(x, y, 16, None, "cpu", seed=s)]) for s in (0, 0, 1)]
    assert torch.equal(order[0], order[1]) and not torch.equal(order[0], order[2])
    assert sum(len(b) for _, b in da.device_batches(x, y, 16, None, "cpu", drop_last=True)) == 48


def test_device_batches_bad_input():
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        next(da.device_batches(batch(4), torch.arange(4), 0, None, "cpu"))
    with pytest.raises(ValueError, match="one label per image"):
        next(da.device_batches(batch(4), torch.arange(3), 2, None, "cpu"))
    with pytest.raises(ValueError, match="device must be"):
        next(da.device_batches(batch(4), torch.arange(4), 2, None, "tpu"))


def test_device_loader_is_reiterable_with_new_shuffles():
    x, y = batch(40), torch.arange(40)
    dl = da.DeviceLoader(x, y, 16, da.DeviceAugment(), "cpu", seed=0)
    assert len(dl) == 3
    e1 = torch.cat([b for _, b in dl])
    e2 = torch.cat([b for _, b in dl])
    assert sorted(e1.tolist()) == sorted(e2.tolist()) == list(range(40))
    assert not torch.equal(e1, e2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_gpu_same_definition():
    x = batch(16).cuda()
    aug = da.DeviceAugment(seed=0)
    out = aug(x)
    assert out.is_cuda
    assert all(da.find_crop(out[i], x[i], aug) is not None for i in range(16))
