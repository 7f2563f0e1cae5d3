import json
import os
import pickle
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from helpers import data, synthetic


@pytest.fixture
def small_synthetic(data_root):
    synthetic.write_fashion_mnist(data_root / "synthetic", n_train=600, n_test=200)
    synthetic.write_cifar10(data_root / "synthetic", n_train=500, n_test=100)
    return data_root


def test_fashion_mnist_synthetic_read_by_torchvision(small_synthetic):
    ds = data.fashion_mnist(train=True)
    assert type(ds).__name__ == "FashionMNIST" and ds.synthetic
    assert len(ds) == 600
    img, label = ds[0]
    assert img.size == (28, 28) and 0 <= label < 10
    assert "SYNTHETIC" in data.describe(ds)
    x, y = data.as_tensors(ds, limit=100)
    assert x.shape == (100, 1, 28, 28) and x.dtype == torch.uint8 and y.dtype == torch.int64


def test_idx_header_is_the_real_format(small_synthetic):
    raw = small_synthetic / "synthetic" / "FashionMNIST" / "raw"
    head = (raw / "train-images-idx3-ubyte").read_bytes()[:16]
    assert struct.unpack(">HBB3I", head) == (0, 8, 3, 600, 28, 28)
    assert struct.unpack(">HBBI", (raw / "t10k-labels-idx1-ubyte").read_bytes()[:8]) == (
        0,
        8,
        1,
        200,
    )


def test_cifar10_synthetic_checked_with_md5(small_synthetic):
    ds = data.cifar10(train=False)
    assert ds.synthetic and len(ds) == 100 and ds.data.shape == (100, 32, 32, 3)
    assert data.as_tensors(ds)[0].shape == (100, 3, 32, 32)
    # torchvision's integrity check really runs: a corrupted batch is refused, by name.
    batch = small_synthetic / "synthetic" / "cifar-10-batches-py" / "test_batch"
    batch.write_bytes(batch.read_bytes()[:-10])
    with pytest.raises(RuntimeError, match="test_batch is truncated or corrupt"):
        data.cifar10(train=False)


def test_cifar_shaped_is_what_notebooks_11_12_and_13_wrote_inline(small_synthetic):
    """Their cell loaded, normalised and labelled the images itself: the same tensors now."""
    images = data.cifar_shaped("synthetic.class_images", 40)
    raw, labels = synthetic.class_images(40, 32, 32, 3, seed=0)
    x = torch.from_numpy(raw).permute(0, 3, 1, 2).contiguous()
    assert images.x.shape == (40, 3, 32, 32) and images.x.dtype == torch.float32
    assert torch.equal(images.x, x.float().div(255).sub(0.5).div(0.25))
    assert torch.equal(images.y, torch.from_numpy(labels))
    assert (images.name, images.synthetic) == ("synthetic CIFAR-shaped images", True)
    assert images.description.startswith("40 SYNTHETIC CIFAR-shaped images")
    cifar = data.cifar_shaped("cifar10", 64)  # offline: the labelled stand-in, 500 images
    x, y = data.as_tensors(data.cifar10(train=True), limit=64)
    assert torch.equal(cifar.x, x.float().div(255).sub(0.5).div(0.25)) and torch.equal(cifar.y, y)
    assert (cifar.name, cifar.synthetic) == ("cifar10", True) and "SYNTHETIC" in cifar.description


def test_offline_never_hangs_and_real_is_a_clear_error(data_root):
    t0 = time.perf_counter()
    assert not data.online("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/")
    with pytest.raises(RuntimeError, match="unreachable"):
        data.load("fashion-mnist", source="real")
    assert time.perf_counter() - t0 < 5


def test_unknown_names():
    with pytest.raises(ValueError, match="valid names are fashion-mnist, cifar10"):
        data.load("imagenet")
    with pytest.raises(ValueError, match="source must be one of 'auto', 'real', 'synthetic'"):
        data.load("cifar10", source="web")


def test_synthetic_is_learnable_but_not_trivial():
    x, y = synthetic.class_images(3000, 28, 28, 1, seed=1)
    xt, yt = synthetic.class_images(1000, 28, 28, 1, seed=2)
    feats = lambda a: a.reshape(len(a), -1).astype(np.float32) / 255  # noqa: E731
    means = np.stack([feats(x)[y == c].mean(0) for c in range(10)])
    pred = ((feats(xt)[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    acc = (pred == yt).mean()
    assert 0.5 < acc < 0.99, acc  # far above chance (0.1), below perfect (label noise)
    with pytest.raises(ValueError, match="n must be"):
        synthetic.class_images(0, 28, 28)


def test_image_folder_writer(tmp_path):
    x, y = synthetic.class_images(20, 32, 32, 3)
    root = synthetic.write_image_folder(tmp_path / "imgs", x, y, synthetic.CIFAR_CLASSES, fmt="png")
    assert len(list(root.rglob("*.png"))) == 20
    with pytest.raises(ValueError, match="fmt must be"):
        synthetic.write_image_folder(tmp_path / "x", x, y, synthetic.CIFAR_CLASSES, fmt="gif")


class _Payload:
    """Unpickling this runs code: what a crafted CIFAR batch file could do."""

    def __reduce__(self):
        return (os.system, (f"touch {os.environ['FTG_PWNED']}",))


def test_cifar_batch_checked_against_checksums_from_the_code(
    small_synthetic, tmp_path, monkeypatch
):
    """A crafted batch file with a manifest that vouches for it is refused, never unpickled."""
    folder = small_synthetic / "synthetic" / "cifar-10-batches-py"
    pwned = tmp_path / "pwned"
    monkeypatch.setenv("FTG_PWNED", str(pwned))
    evil = pickle.dumps(_Payload(), protocol=2)
    (folder / "test_batch").write_bytes(evil)
    manifest = json.loads((folder / synthetic.MARKER).read_text())
    import hashlib

    manifest["md5"] = {"test_batch": hashlib.md5(evil).hexdigest()}  # the folder vouches for it
    (folder / synthetic.MARKER).write_text(json.dumps(manifest))
    with pytest.raises(RuntimeError, match="test_batch is truncated or corrupt"):
        data.cifar10(train=False)
    assert not pwned.exists(), "the crafted batch file was unpickled"


@pytest.mark.slow
def test_cifar_checksum_table_matches_the_writer():
    """The shipped table is what the writer produces at the default sizes (a numpy or pickle
    change that alters the bytes shows up here, not as 'corrupt' data on a learner's machine)."""
    files = synthetic._cifar_files(*synthetic.CIFAR_MAX)
    import hashlib

    assert {n: hashlib.md5(b).hexdigest() for n, b in files.items()} == synthetic.CIFAR_DEFAULT_MD5


WRITER = """
import sys
from helpers import data, synthetic
import numpy as np
x, y = synthetic.class_images(300, 16, 16, 3)
for _ in range(3):
    synthetic.write_image_folder(sys.argv[1], x, y, [f"class_{c}" for c in range(10)])
    files = sorted(__import__("pathlib").Path(sys.argv[1]).rglob("*.png"))
    assert len(files) == 300, len(files)
    [f.read_bytes() for f in files]
ds = data.fashion_mnist(train=True)
assert ds.synthetic and len(ds) == 60000
"""


@pytest.mark.slow
def test_two_writers_of_a_fresh_data_folder_do_not_race(data_root, tmp_path):
    """Two processes write the same image folder and the same synthetic data set at once:
    both succeed, and neither ever sees a missing or half-written file."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(data.paths.ROOT), os.environ.get("PYTHONPATH")])
        ),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path / "imgs")],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "temporary folders left"
    assert not [p for p in (data_root / "synthetic").iterdir() if p.name.endswith(".tmp")]


# --- TensorBatches: every sample once per epoch, reshuffled, staged copies that match plain
# indexing (notebook 06 asserts its batched crop/flip against the definition)


def batch(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)


def test_batches_cover_the_data_once_and_reshuffle_each_epoch():
    x = batch(50)
    y = torch.arange(50)
    b = data.TensorBatches(x, y, 16, augment=data.to_unit_float, device="cpu", seed=0)
    assert len(b) == 4
    seen = []
    for X, yb in b:
        assert X.dtype == torch.float32 and len(X) == len(yb) <= 16
        seen.append(yb)
    assert sorted(torch.cat(seen).tolist()) == list(range(50))
    second = torch.cat([yb for _, yb in b])
    assert sorted(second.tolist()) == list(range(50)) and not torch.equal(torch.cat(seen), second)
    # the same seed gives the same order, another seed another one
    order = [
        torch.cat([yb for _, yb in data.TensorBatches(x, y, 16, device="cpu", seed=s)])
        for s in (0, 0, 1)
    ]
    assert torch.equal(order[0], order[1]) and not torch.equal(order[0], order[2])
    assert torch.equal(order[0], torch.cat(seen))  # an epoch's order depends on the seed alone
    unshuffled = torch.cat(
        [yb for _, yb in data.TensorBatches(x, y, 16, device="cpu", shuffle=False)]
    )
    assert torch.equal(unshuffled, y)


def test_drop_last_gives_one_shape_but_never_no_batch():
    x, y = batch(50), torch.arange(50)
    b = data.TensorBatches(x, y, 16, device="cpu", drop_last=True)
    assert {len(xb) for xb, _ in b} == {16} and len(b) == 3
    small = data.TensorBatches(x[:10], y[:10], 16, device="cpu", drop_last=True)
    assert len(small) == 1 and [len(xb) for xb, _ in small] == [10]


@pytest.mark.parametrize("mode", ["memory", "device"])
def test_unit_float_gives_totensor_values(mode):
    x, y = batch(40), torch.arange(40)
    b = data.TensorBatches(x, y, 16, augment=data.to_unit_float, mode=mode, device="cpu", seed=2)
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
    kw = dict(augment=data.to_unit_float, mode="memory", device="cpu", seed=5)
    plain = data.TensorBatches(x, y, 20, staging=False, **kw)
    staged = data.TensorBatches(x, y, 20, staging=True, **kw)
    assert staged._bufs and not plain._bufs
    a, b = list(plain), list(staged)
    assert len(a) == len(b) == 5 and b[-1][0].shape[0] == 16  # the partial last batch too
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=0), r"TensorBatches: batch_size must be an int >= 1, got 0"),
        (dict(y=torch.arange(3)), "one label per image"),
        (dict(x=batch(4).float()), "x must be a uint8 tensor of shape"),
        (dict(device="tpu"), "device must be"),
        (dict(mode="disk"), r"TensorBatches: mode must be one of 'device', 'memory', got 'disk'"),
    ],
)
def test_batches_bad_input(kwargs, match):
    args = dict(x=batch(4), y=torch.arange(4), batch_size=2, device="cpu") | kwargs
    with pytest.raises(ValueError, match=match):
        data.TensorBatches(args.pop("x"), args.pop("y"), args.pop("batch_size"), **args)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: pinned staging buffers"
)
def test_staging_buffers_are_pinned_on_cuda():
    x, y = batch(64), torch.arange(64)
    b = data.TensorBatches(x, y, 32, augment=data.to_unit_float, mode="memory", device="cuda")
    assert all(buf[0].is_pinned() and buf[1].is_pinned() for buf in b._bufs)
    xs = torch.cat([xb.cpu() for xb, _ in b])
    assert torch.allclose(xs.sum(0), (x.float() / 255).sum(0), atol=1e-3)


def test_torchvision_is_imported_on_the_first_load_not_with_the_helpers():
    """Importing torchvision takes about 2 s (its models import torch._dynamo): a notebook that
    imports `helpers.data` and never loads a data set must not pay it, one that loads one does."""
    script = (
        "import sys\n"
        "from helpers import data\n"
        "print('torchvision' in sys.modules)\n"
        "data._dataset_class('cifar10')\n"
        "print('torchvision' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert out == ["False", "True"]
