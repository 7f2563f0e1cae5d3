"""Where things live on disk. Environment variables let tests and CI redirect them."""

from __future__ import annotations

import os
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def in_checkout() -> bool:
    """True when the helpers run from a clone of the suite, False when pip installed them into
    site-packages (Colab, Kaggle, `pip install` of the project)."""
    return not {"site-packages", "dist-packages"} & set(ROOT.parts)


def _dir(env: str, *default: str) -> Path:
    # installed, the working directory (/content on Colab): never write into site-packages
    return Path(
        os.environ.get(env) or (ROOT if in_checkout() else Path.cwd()).joinpath(*default)
    ).resolve()


def data_dir() -> Path:
    """Data sets, real or synthetic: `FTG_DATA_DIR`, default `<repo>/data` (`./data` installed)."""
    return _dir("FTG_DATA_DIR", "data")


def build_dir() -> Path:
    """Executed notebooks, results, traces and the report: `FTG_BUILD_DIR`, default
    `<repo>/build` (`./build` installed)."""
    return _dir("FTG_BUILD_DIR", "build")


def results_dir() -> Path:
    """This machine's measurements (a JSON file per notebook): `FTG_RESULTS_DIR`, which
    `make run` points at its run folder, else `<build>/results`."""
    return Path(os.environ.get("FTG_RESULTS_DIR") or build_dir() / "results").resolve()


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write under a temporary name in the same folder, then rename: a reader (or a second
    writer) never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def reference_results_dir() -> Path:
    """Results committed from GPU runs, shown beside this machine's in the report."""
    return ROOT / "results" / "reference"
