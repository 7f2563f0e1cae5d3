"""Where things live on disk. Environment variables let tests and CI redirect them."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _dir(env: str, default: Path) -> Path:
    return Path(os.environ.get(env, default)).resolve()


def data_dir() -> Path:
    """Data sets, real or synthetic (`FTG_DATA_DIR`, default `<repo>/data`)."""
    return _dir("FTG_DATA_DIR", ROOT / "data")


def build_dir() -> Path:
    """Executed notebooks, results, traces and the report (`FTG_BUILD_DIR`, default `<repo>/build`)."""
    return _dir("FTG_BUILD_DIR", ROOT / "build")


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
