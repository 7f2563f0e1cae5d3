"""Where things live on disk. Environment variables let tests and CI redirect them."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
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
    """This machine's recorded measurements (one JSON file per notebook): `FTG_RESULTS_DIR`,
    which `make run` points at its own run folder, else `<build>/results` (notebooks run alone,
    `make test`)."""
    return _dir("FTG_RESULTS_DIR", build_dir() / "results")


def runs_dir() -> Path:
    """`<build>/runs/`: one folder per `make run`, so runs never overwrite each other."""
    return build_dir() / "runs"


def new_run_dir(keep: int = 20) -> Path:
    """A fresh `<build>/runs/<date>_<time>[_N]/` (created here: two runs started in the same
    second get different folders). Older finished runs beyond the newest `keep` are removed
    (never one still running: its `run.json` says so)."""
    root = runs_dir()
    root.mkdir(parents=True, exist_ok=True)
    for old in sorted(d for d in root.iterdir() if d.is_dir())[:-keep]:
        try:
            if json.loads((old / "run.json").read_text()).get("state") in ("finished", "interrupted"):
                shutil.rmtree(old, ignore_errors=True)
        except (OSError, ValueError):
            pass
    stamp = time.strftime("%Y-%m-%d_%H%M%S")
    for n in range(1000):
        d = root / (stamp if n == 0 else f"{stamp}_{n}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise RuntimeError(f"new_run_dir: could not create a run folder under {root}")


def latest_run() -> Path | None:
    """The run folder `<build>/latest` points to (the last `make run` started), or None."""
    link = build_dir() / "latest"
    return link.resolve() if link.is_symlink() and link.resolve().is_dir() else None


def point_latest(run: Path) -> None:
    """Point `<build>/latest` at `run`, atomically (a new link renamed over the old one)."""
    link = build_dir() / "latest"
    tmp = link.with_name(f".latest.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(run, link.parent))
    tmp.replace(link)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a file under a temporary name in the same folder, then rename it into place: a
    reader (or a second writer) never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def reference_results_dir() -> Path:
    """Results committed from GPU runs, shown beside this machine's in the report."""
    return ROOT / "results" / "reference"


def reference_run_dir(device_name: str, date: str | None = None) -> Path:
    """`results/reference/<date>_<device>/`: where one machine's committed run goes."""
    if not isinstance(device_name, str) or not device_name.strip():
        raise ValueError(f"reference_run_dir: device_name must be a non-empty string, got {device_name!r}")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device_name).strip("-")
    return reference_results_dir() / f"{date or time.strftime('%Y-%m-%d')}_{slug}"


def save_reference(results: Path, target: Path | None = None) -> Path:
    """Copy a run's result files (JSON, one per notebook) to a reference folder, named after the
    first GPU the run found (else the CPU) unless `target` is given. Figures stay behind: the
    report shows a reference run's figures and verdicts, not its plots."""
    files = sorted(Path(results).glob("*.json"))
    if not files:
        raise FileNotFoundError(f"save_reference: no result files in {results}; run the notebooks first")
    if target is None:
        hw = json.loads(files[0].read_text()).get("hardware", {})
        gpus = hw.get("gpus") or []
        target = reference_run_dir(gpus[0]["name"] if gpus else hw.get("cpu") or "cpu")
    target.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(f, target / f.name)
    return target
