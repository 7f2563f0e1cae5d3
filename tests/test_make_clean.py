"""`make clean` removes executed copies, generated data and results, never the sources."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_clean_keeps_sources(tmp_path):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    keep = [
        "notebooks/00_x.ipynb",
        "notebooks/catalog.toml",
        "helpers/timing.py",
        "data/README.md",
        "results/reference/h100/00_x.json",
        ".venv/lib/__pycache__/kept.pyc",
    ]
    gone = [
        "build/notebooks/00_x.ipynb",
        "build/results/00_x.json",
        "build/report.html",
        "data/synthetic/FashionMNIST/raw/train-images-idx3-ubyte",
        "data/fmnist_png_1500/done",
        "helpers/__pycache__/timing.cpython-311.pyc",
    ]
    for rel in keep + gone:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    subprocess.run(["make", "-s", "clean"], cwd=tmp_path, check=True, timeout=60)
    assert [r for r in keep if not (tmp_path / r).exists()] == []
    assert [r for r in gone if (tmp_path / r).exists()] == []
