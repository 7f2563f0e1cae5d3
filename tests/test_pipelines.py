"""helpers.pipelines: the CPU image pipeline, its argument checks, spawn-safety, no leftovers."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from helpers import pipelines, synthetic


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    x, y = synthetic.class_images(96, 32, 32, 3, seed=7)
    root = tmp_path_factory.mktemp("imgs")
    synthetic.write_image_folder(root, x, y, synthetic.CIFAR_CLASSES, fmt="png")
    return root, x, y


@pytest.fixture(scope="module")
def dataset(folder):
    return pipelines.image_folder(folder[0], transform=pipelines.cifar_train_transform())


def test_image_folder_decodes_the_pixels_written(folder):
    root, x, y = folder
    ds = pipelines.image_folder(root)
    assert len(ds) == len(x)
    path, label = ds.samples[0]
    i = int(path.rsplit("/", 1)[1].split(".")[0])
    assert np.array_equal(np.asarray(ds.loader(path)), x[i]) and label == y[i]


def test_train_transform_output(dataset):
    X, label = dataset[3]
    assert X.shape == (3, 32, 32) and X.dtype == torch.float32
    assert -3 < X.mean().item() < 3 and isinstance(label, int)


def test_transform_is_random_per_sample(dataset):
    torch.manual_seed(0)
    a = torch.stack([dataset[0][0] for _ in range(8)])
    assert not all(torch.equal(a[0], a[i]) for i in range(1, 8))


@pytest.mark.slow
def test_spawn_worker_loads_batches(dataset):
    # everything a worker runs comes from an importable module: `spawn` (macOS, Windows) works
    loader = DataLoader(dataset, batch_size=16, num_workers=1, multiprocessing_context="spawn")
    n = 0
    for X, y in loader:
        assert X.shape[1:] == (3, 32, 32) and X.dtype == torch.float32
        n += len(y)
    assert n == len(dataset)
    del loader
    gc.collect()
    assert pipelines.live_workers() == []


def test_persistent_workers_live_with_their_loader_and_end_with_del(dataset):
    # the notebooks end loaders with `del loader` (public API only): persistent workers survive
    # the epoch - the check can fail - and are gone once the loader object is
    loader = DataLoader(dataset, batch_size=16, num_workers=2, persistent_workers=True)
    assert sum(len(y) for _, y in loader) == len(dataset)
    assert len(pipelines.live_workers()) == 2
    del loader
    assert pipelines.live_workers() == []


def test_missing_data_path_names_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="root: the image folder .* does not exist"):
        pipelines.image_folder(tmp_path / "nope")


def test_prepare_image_folder_bad_arguments():
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        pipelines.prepare_image_folder(0)
    with pytest.raises(ValueError, match="prepare_image_folder: fmt must be one of 'png', 'jpeg'"):
        pipelines.prepare_image_folder(8, fmt="gif")


def test_prepare_image_folder_writes_and_reuses(tmp_path):
    root, syn = pipelines.prepare_image_folder(20, root=tmp_path / "f")
    assert len(pipelines.image_folder(root)) == 20 and isinstance(syn, bool)
    stamp = (root / "COMPLETE.json").stat().st_mtime
    again, _ = pipelines.prepare_image_folder(20, root=tmp_path / "f")
    assert again == root and (root / "COMPLETE.json").stat().st_mtime == stamp


def test_per_sample_tensor_dataset_and_checks():
    x = torch.randint(0, 256, (10, 3, 32, 32), dtype=torch.uint8)
    y = torch.arange(10)
    ds = pipelines.PerSampleTensorDataset(x, y, pipelines.tensor_train_transform())
    X, label = ds[4]
    assert X.shape == (3, 32, 32) and X.dtype == torch.float32 and label == 4
    with pytest.raises(ValueError, match="uint8"):
        pipelines.PerSampleTensorDataset(x.float(), y)
    with pytest.raises(ValueError, match="same length"):
        pipelines.PerSampleTensorDataset(x, y[:3])


def fake_dali(monkeypatch, batches_per_epoch: int = 3) -> dict:
    """`nvidia.dali` as far as `dali_batches` uses it: pipelines count their builds, and the
    iterator serves `batches_per_epoch` batches, then resets itself (`auto_reset=True`)."""
    import types

    log = {"builds": 0, "served": 0}

    class Pipe:
        def build(self):
            log["builds"] += 1

    def pipeline_def(**kw):
        return lambda body: lambda: Pipe()  # the graph's body runs only inside real DALI

    class Iterator:
        def __init__(self, pipes, names, *, reader_name, last_batch_policy, auto_reset):
            assert auto_reset and all(isinstance(p, Pipe) for p in pipes)
            self.names = names

        def __iter__(self):
            for _ in range(batches_per_epoch):
                log["served"] += 1
                yield [{"x": torch.zeros(2, 3, 32, 32), "y": torch.zeros(2, 1, dtype=torch.int32)}]

    dali = types.ModuleType("nvidia.dali")
    dali.fn, dali.types, dali.pipeline_def = (
        types.SimpleNamespace(),
        types.SimpleNamespace(),
        pipeline_def,
    )
    plugin = types.ModuleType("nvidia.dali.plugin.pytorch")
    plugin.DALIGenericIterator = Iterator
    plugin.LastBatchPolicy = types.SimpleNamespace(PARTIAL="partial")
    for name, mod in {
        "nvidia": types.ModuleType("nvidia"),
        "nvidia.dali": dali,
        "nvidia.dali.plugin": types.ModuleType("nvidia.dali.plugin"),
        "nvidia.dali.plugin.pytorch": plugin,
    }.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return log


def test_dali_pipeline_is_built_once_and_iterated_once_per_epoch(monkeypatch, tmp_path):
    log = fake_dali(monkeypatch)
    batches = pipelines.dali_batches(tmp_path, batch_size=2)
    assert log == {"builds": 1, "served": 0}  # built before any epoch is timed
    for _ in range(3):  # a warm-up and two timed epochs: the same pipeline each time
        epoch = list(batches)
        assert len(epoch) == 3
        X, y = epoch[0]
        assert X.shape == (2, 3, 32, 32) and y.shape == (2,) and y.dtype == torch.int64
    assert log == {"builds": 1, "served": 9}
    with pytest.raises(FileNotFoundError, match="root: the image folder"):
        pipelines.dali_batches(tmp_path / "missing", batch_size=2)
