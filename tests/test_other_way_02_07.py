"""L4 (notebook 02) and L18's learning-rate half (notebook 07) come out each way this CPU can
reach through the notebooks' own measuring cells, extracted and run at tiny sizes. L4 is timed,
so its workloads' costs are sleeps, far from the thresholds, where a busy machine cannot move
them: a disk whose file reads sleep, a decode that sleeps, a loader whose own work sleeps. L18's
half is a final loss, not a time: deterministic seeds make it exactly reproducible."""

import io
import shutil
import tempfile
import time
import types
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision import datasets, transforms

from helpers import devices, plotting, synthetic, timing, training
from helpers.suite import claims
from helpers.suite.results import Recorder
from tests.notebook_scripts import code_cell

NB02, NB06 = "02_data_loading.ipynb", "07_batch_size_and_accumulation.ipynb"
# 02's cells behind L4: the stage timings, the four loaders, their epochs, the verdict
L4_CELLS = ("per_sample_us = {", "def folder_loader(", 'timings["in RAM, decoded"]', '"L4",')
# 07's cells behind L18's learning-rate half: the three runs, their final losses, the verdict
L18_CELLS = ("SMALL_B, BIG_B, LR0 =", "small, big_same, big_scaled = ", '"L18",')


def _sleep(seconds: float) -> None:
    """A cost of `seconds`; none at 0 (`time.sleep(0)` yields the CPU: on a busy machine that
    alone costs a time slice)."""
    if seconds:
        time.sleep(seconds)


def _l4_cells(tmp_path, n: int, read_s: float, decode_s: float, own_s: float = 0.0) -> str:
    """02's L4 cells run on `n` PNG files on a disk where each read of a file costs `read_s`,
    decoded by a PIL whose `Image.open` costs `decode_s`, in an ImageFolder whose own work (a
    label lookup, say) costs `own_s` a sample, unseen by the stage timings: the verdict, as
    judged by the rule. Each cost is a sleep; a loader sleeps once a sample, whatever it pays
    for (a busy machine wakes a sleeper late, here by up to ~20 ms: a wake-up more in one loader
    would count as its cost)."""
    root, in_folder = tmp_path / "png", [False]
    images, _ = synthetic.class_images(n, 28, 28, seed=1)
    labels = np.arange(n) % 2  # both class folders hold files: ImageFolder refuses an empty one
    synthetic.write_image_folder(root, images, labels, ["class_0", "class_1"])

    class OnTheDisk(type(Path())):  # a file under `root`: every read of it costs read_s
        def read_bytes(self):
            _sleep(read_s)
            return super().read_bytes()

    class Folder(datasets.ImageFolder):  # its own work is paid in the sample's one sleep
        def __getitem__(self, index):
            in_folder[0] = True
            try:
                return super().__getitem__(index)
            finally:
                in_folder[0] = False

    def open_image(fp):  # PIL's: a path under `root` is read from the disk, then decoded
        from_disk = isinstance(fp, str | Path) and Path(fp).is_relative_to(root)
        _sleep(decode_s + (read_s if from_disk else 0.0) + (own_s if in_folder[0] else 0.0))
        return Image.open(fp)

    ns = {
        "io": io,
        "Image": types.SimpleNamespace(open=open_image),
        "datasets": types.SimpleNamespace(ImageFolder=Folder),
        "DataLoader": DataLoader,
        "TensorDataset": TensorDataset,
        "transforms": transforms,
        "Path": Path,
        "shutil": shutil,
        "tempfile": tempfile,
        "plt": plt,
        "plotting": plotting,
        "timing": timing,
        "record": Recorder("02_other_way", directory=tmp_path),
        "png_root": root,
        "files": sorted(OnTheDisk(p) for p in root.rglob("*.png")),
        "images": torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(),
        "labels": torch.from_numpy(labels),
        "N_IMAGES": n,
        "BATCH": 256,
        "REPEATS": 3,
    }
    src = "\n".join(code_cell(NB02, marker) for marker in L4_CELLS)
    with devices.cpu_threads(1):
        exec(compile(src, "02_data_loading.ipynb:L4", "exec"), ns)
    plt.close("all")
    return ns["record"].data["verdicts"][-1]["verdict"]


@pytest.mark.slow
def test_l4_each_way_with_a_slow_disk_a_slow_decode_and_a_slow_loader(tmp_path):
    """A read of 30 ms a file beside a 2 ms decode: holding the bytes in RAM gives ~10x the
    samples/s, >= 1.4x even if every decode woke 20 ms late. A 25 ms decode beside the real
    read (tens of us): a gain of a few % and a read share under 1 %. A 2 ms read beside the
    real decode and transform (~0.3 ms) is most of the stages' time, yet 40 ms of the loader's
    own work a sample holds the gain near 1.05x: the read share is timed over read, decode and
    transform only, the gain over whole epochs (without such work the gain is about
    1 / (1 - share), >= 1.33x at a share >= 25 %). A busy spell may leave a range across a
    threshold ("inconclusive"), never another outcome."""
    disk = _l4_cells(tmp_path / "disk", 3, read_s=0.03, decode_s=0.002)
    decode = _l4_cells(tmp_path / "decode", 3, read_s=0.0, decode_s=0.025)
    loader = _l4_cells(tmp_path / "loader", 3, read_s=0.002, decode_s=0.0, own_s=0.04)
    assert disk == claims.HOLDS or disk.startswith("inconclusive"), disk
    assert claims.kind_of(decode) in ("holds only when", "inconclusive"), decode
    assert loader == claims.NOT_HERE or loader.startswith("inconclusive"), loader
    outcomes = [claims.kind_of(v) for v in (disk, decode, loader)]
    assert outcomes.count("inconclusive") < len(outcomes), "no workload decided: busy throughout?"


def _l18_cells(tmp_path, samples: int, epochs: int, input_scale: float = 1.0) -> tuple:
    """07's L18 cells (three runs, their final losses, the verdict) on `samples` synthetic
    Fashion-MNIST images for `epochs` epochs, normalised as 06 does, then scaled by
    `input_scale`: (the verdict, the three final losses)."""
    images, labels = synthetic.class_images(samples, 28, 28, seed=1)
    X = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    ns = {
        "torch": torch,
        "nn": nn,
        "training": training,
        "plotting": plotting,
        "device": torch.device("cpu"),
        "record": Recorder("06_other_way", directory=tmp_path),
        "X_all": (X / 255 - 0.286) / 0.353 * input_scale,
        "y_all": torch.from_numpy(labels),
        "LR_SAMPLES": samples,
        "LR_EPOCHS": epochs,
    }
    src = "\n".join(code_cell(NB06, marker) for marker in L18_CELLS)
    exec(compile(src, "07_batch_size_and_accumulation.ipynb:L18", "exec"), ns)
    plt.close("all")
    return ns["record"].data["verdicts"][-1]["verdict"], tuple(ns["final_loss"].values())


@pytest.mark.slow
def test_l18_lr_half_holds_at_06s_sizes_and_not_in_a_one_step_or_overshooting_run(tmp_path):
    """At 07's smoke sizes (2,048 images, 2 epochs) batch 256 falls behind batch 32 with the
    same lr and the 8x lr catches up most of the way: holds. One epoch of 256 images is one step
    of batch 256, and an epoch's loss is taken before each step: both lrs report the untrained
    loss, the scaled one not lower. Inputs at 4x the normalised scale act on the first layer
    like a 16x lr (its gradient and a step's effect each grow 4x): the 8x lr overshoots to a
    finite loss above the same lr's. Deterministic: exact outcomes, no "inconclusive"."""
    holds, (small, same, scaled) = _l18_cells(tmp_path / "smoke", 2048, 2)  # 07's smoke sizes
    one_step, (_, same_1, scaled_1) = _l18_cells(tmp_path / "one_step", 256, 1)
    overshoot, (_, same_x, scaled_x) = _l18_cells(tmp_path / "overshoot", 1024, 2, 4.0)
    assert holds == "holds (learning-rate part)", (small, same, scaled)
    assert one_step == claims.NOT_HERE and scaled_1 == same_1, (same_1, scaled_1)
    assert overshoot == claims.NOT_HERE and same_x < scaled_x < float("inf"), (same_x, scaled_x)
