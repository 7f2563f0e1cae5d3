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
    assert struct.unpack(">HBBI", (raw / "t10k-labels-idx1-ubyte").read_bytes()[:8]) == (0, 8, 1, 200)


def test_cifar10_synthetic_checked_with_md5(small_synthetic):
    ds = data.cifar10(train=False)
    assert ds.synthetic and len(ds) == 100 and ds.data.shape == (100, 32, 32, 3)
    assert data.as_tensors(ds)[0].shape == (100, 3, 32, 32)
    # torchvision's integrity check really runs: a corrupted batch is refused, by name.
    batch = small_synthetic / "synthetic" / "cifar-10-batches-py" / "test_batch"
    batch.write_bytes(batch.read_bytes()[:-10])
    with pytest.raises(RuntimeError, match="test_batch is truncated or corrupt"):
        data.cifar10(train=False)


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


def test_cifar_batch_checked_against_checksums_from_the_code(small_synthetic, tmp_path, monkeypatch):
    """A crafted batch file with a manifest that vouches for it is refused, never unpickled."""
    folder = small_synthetic / "synthetic" / "cifar-10-batches-py"
    pwned = tmp_path / "pwned"
    monkeypatch.setenv("FTG_PWNED", str(pwned))
    evil = pickle.dumps(_Payload(), protocol=2)
    (folder / "test_batch").write_bytes(evil)
    manifest = json.loads((folder / synthetic.MARKER).read_text())
    import hashlib

    manifest["md5"]["test_batch"] = hashlib.md5(evil).hexdigest()  # the folder's own checksum agrees
    (folder / synthetic.MARKER).write_text(json.dumps(manifest))
    with pytest.raises(RuntimeError, match="test_batch is truncated or corrupt"):
        data.cifar10(train=False)
    assert not pwned.exists(), "the crafted batch file was unpickled"


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


def test_two_writers_of_a_fresh_data_folder_do_not_race(data_root, tmp_path):
    """Two processes write the same image folder and the same synthetic data set at once:
    both succeed, and neither ever sees a missing or half-written file."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(data.paths.ROOT),
                                                                    os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "imgs")], env=env,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "temporary folders left"
    assert not [p for p in (data_root / "synthetic").iterdir() if p.name.endswith(".tmp")]
