"""No DataLoader worker process outlives notebooks 03 and 06.

Each of those notebooks ends with a cell that asserts, inside its own kernel, that
`pipelines.live_workers()` is empty; nbval runs that cell in `make test`. Here we check that
the cell is there (so nobody drops it silently) and that the check really sees live workers.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from torch.utils.data import DataLoader

from helpers import pipelines, synthetic

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def test_live_workers_sees_persistent_workers_and_their_end(tmp_path):
    x, y = synthetic.class_images(32, 32, 32, 3)
    synthetic.write_image_folder(tmp_path, x, y, synthetic.CIFAR_CLASSES)
    ds = pipelines.image_folder(tmp_path, transform=pipelines.cifar_train_transform())
    loader = DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    for _batch in loader:
        pass
    assert len(pipelines.live_workers()) == 2
    del loader  # as the notebooks end their loaders
    assert pipelines.live_workers() == []


@pytest.mark.parametrize("name", ["03_dataloader_workers.ipynb", "06_gpu_data_pipelines.ipynb"])
def test_notebook_ends_by_asserting_no_worker_is_left(name):
    code = [c.source for c in nb_cells(name) if c.cell_type == "code"]
    checks = [
        i
        for i, src in enumerate(code)
        if "pipelines.live_workers()" in src and "assert not left" in src
    ]
    assert checks, f"{name} has no cell asserting that no worker is left"
    after = code[checks[-1] + 1 :]
    assert not any("DataLoader(" in src for src in after), (
        "a loader is created after the final no-worker-left check"
    )


def nb_cells(name):
    return nbformat.read(NOTEBOOKS / name, as_version=4).cells
