"""Where things live on disk. Environment variables let tests and CI redirect them."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def in_checkout() -> bool:
    """True when the helpers run from a clone of the suite (editable install or PYTHONPATH), False
    when pip installed them into site-packages (Colab, Kaggle, `pip install` of the project)."""
    return not {"site-packages", "dist-packages"} & set(ROOT.parts)


def _base() -> Path:
    # An installed package must not write data sets and results into site-packages: it uses the
    # working directory instead (/content on Colab, /kaggle/working on Kaggle).
    return ROOT if in_checkout() else Path.cwd()


def _dir(env: str, default: Path) -> Path:
    return Path(os.environ.get(env, default)).resolve()


def data_dir() -> Path:
    """Data sets, real or synthetic (`FTG_DATA_DIR`, default `<repo>/data`, or `./data` when the
    helpers are installed rather than in a clone)."""
    return _dir("FTG_DATA_DIR", _base() / "data")


def build_dir() -> Path:
    """Executed notebooks, results, traces and the report (`FTG_BUILD_DIR`, default `<repo>/build`,
    or `./build` when the helpers are installed rather than in a clone)."""
    return _dir("FTG_BUILD_DIR", _base() / "build")


def results_dir() -> Path:
    """This machine's recorded measurements (one JSON file per notebook)."""
    return build_dir() / "results"


def reference_results_dir() -> Path:
    """Results committed from GPU runs, shown beside this machine's in the report."""
    return ROOT / "results" / "reference"


def reference_run_dir(device_name: str, date: str | None = None) -> Path:
    """`results/reference/<date>_<device>/`: where one machine's committed run goes."""
    if not isinstance(device_name, str) or not device_name.strip():
        raise ValueError(f"reference_run_dir: device_name must be a non-empty string, got {device_name!r}")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device_name).strip("-")
    return reference_results_dir() / f"{date or time.strftime('%Y-%m-%d')}_{slug}"
