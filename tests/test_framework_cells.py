"""The Lightning and accelerate cell of notebooks 07-12, run with both packages importable.

Neither package is in the pins (the suite teaches plain PyTorch; one cell per notebook shows the
same technique in both, and says "skipped" for one that is not installed). A GPU image often has
them, so the cell must work when they do run: this test executes each notebook (smoke profile)
with them importable and checks that both trained, not skipped.

Opt-in, because it needs the packages, which the pinned environment does not have:
    FTG_FRAMEWORKS_DIR=DIR   a folder where they are installed, e.g. by
        python -m pip install --target DIR --no-deps lightning lightning-utilities torchmetrics \
            accelerate huggingface_hub safetensors
        (--no-deps: torch and the rest come from the environment, which is not modified)
    FTG_FRAMEWORKS_DIR=install   the same into a temporary folder (needs the package index)
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from helpers.suite import runner

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [
    "lightning",
    "lightning-utilities",
    "torchmetrics",
    "accelerate",
    "huggingface_hub",
    "safetensors",
]
NOTEBOOKS = [
    "07_batch_size_and_accumulation",
    "08_item_hygiene",
    "09_device_placement",
    "12_mixed_precision",
]


@pytest.fixture(scope="module")
def frameworks_dir(tmp_path_factory) -> Path:
    where = os.environ.get("FTG_FRAMEWORKS_DIR", "")
    if not where:
        pytest.skip(
            "opt-in: set FTG_FRAMEWORKS_DIR to a folder with lightning and accelerate "
            "installed, or to 'install' (see this file's docstring)"
        )
    if where == "install":
        target = tmp_path_factory.mktemp("frameworks")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--target",
                str(target),
                "--no-deps",
                *PACKAGES,
            ],
            check=True,
            timeout=600,
        )
        return target
    target = Path(where)
    if not (target / "lightning").is_dir() or not (target / "accelerate").is_dir():
        pytest.fail(f"FTG_FRAMEWORKS_DIR={where}: no lightning/ and accelerate/ there")
    return target


def _framework_cell_output(nb: nbformat.NotebookNode) -> str:
    cells = [
        c
        for c in nb.cells
        if c.cell_type == "code"
        and ('find_spec("lightning")' in c.source or 'find_spec("accelerate")' in c.source)
    ]
    assert len(cells) == 1, "one cell per notebook shows the technique in both frameworks"
    return "".join(
        o.get("text", "") for c in cells for o in c.outputs if o.get("output_type") == "stream"
    )


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_lightning_and_accelerate_cells_train(name, frameworks_dir, tmp_path, monkeypatch):
    # the kernel inherits this environment: the frameworks first, then this checkout's helpers
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(frameworks_dir), str(ROOT)]))
    monkeypatch.setenv("FTG_PROFILE", "smoke")
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path / "build"))
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    runner.headless_client(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "notebooks")}},
    ).execute()
    out = _framework_cell_output(nb)
    assert "is not installed: skipped" not in out, out
    assert "Lightning: " in out and "accelerate: " in out, out


def _trainer_calls(source: str) -> list[ast.Call]:
    """Every call of a name or attribute called `Trainer` in `source` (magics removed)."""
    python = TransformerManager().transform_cell(source)
    return [
        node
        for node in ast.walk(ast.parse(python))
        if isinstance(node, ast.Call)
        and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "Trainer"
    ]


def _one_device(call: ast.Call) -> bool:
    return any(
        k.arg == "devices" and isinstance(k.value, ast.Constant) and k.value.value == 1
        for k in call.keywords
    )


def test_every_lightning_trainer_asks_for_one_device():
    """`devices="auto"` on Kaggle's 2 x T4 starts DDP processes from the notebook's kernel."""
    calls = [
        (path.stem, call)
        for path in sorted((ROOT / "notebooks").glob("*.ipynb"))
        for cell in nbformat.read(path, as_version=4).cells
        if cell.cell_type == "code"
        for call in _trainer_calls(cell.source)
    ]
    assert len({name for name, _ in calls}) >= 4, "the Lightning cells were not found"
    assert [name for name, call in calls if not _one_device(call)] == []


def test_the_one_device_check_can_fail():
    (auto,) = _trainer_calls('L.Trainer(max_epochs=1, accelerator="auto")')
    (one,) = _trainer_calls('trainer = Trainer(accelerator="auto", devices=1)')
    assert not _one_device(auto) and _one_device(one)
