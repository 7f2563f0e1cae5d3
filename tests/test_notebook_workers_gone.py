"""No DataLoader worker process outlives notebooks 02 and 03.

Each notebook is executed in a real Jupyter kernel (nbclient, smoke profile); before the kernel
is shut down, the test lists the kernel's live child processes from outside. A control
notebook that keeps a persistent-worker loader alive shows that the check does see workers.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from helpers import worker_memory

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _run_and_list_workers(nb: nbformat.NotebookNode) -> list:
    env_before = dict(os.environ)
    os.environ.setdefault("FTG_PROFILE", "smoke")
    os.environ["PYTHONPATH"] = str(NOTEBOOKS.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")
    try:
        client = NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}})
        with client.setup_kernel():
            for i, cell in enumerate(nb.cells):
                if cell.cell_type == "code":
                    client.execute_cell(cell, i)
            pid = client.km.provisioner.pid
            return [p.pid for p in worker_memory.live_workers(pid)]
    finally:
        os.environ.clear()
        os.environ.update(env_before)


def test_control_kernel_with_persistent_workers_is_detected(tmp_path):
    code = f"""
from helpers import pipelines, synthetic
x, y = synthetic.class_images(32, 32, 32, 3)
synthetic.write_image_folder({str(tmp_path)!r}, x, y, synthetic.CIFAR_CLASSES)
ds = pipelines.image_folder({str(tmp_path)!r}, transform=pipelines.cifar_train_transform())
loader = pipelines.make_loader(ds, batch_size=8, num_workers=2, persistent_workers=True)
n = pipelines.consume(loader)
"""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    assert len(_run_and_list_workers(nb)) == 2


@pytest.mark.parametrize("name", ["02_dataloader_workers.ipynb", "03_gpu_data_pipelines.ipynb"])
def test_no_worker_left_after_notebook(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert _run_and_list_workers(nb) == []
