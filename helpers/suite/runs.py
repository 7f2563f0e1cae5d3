"""Run folders: `<build>/runs/<time>/` per run of the suite, `<build>/latest` pointing at the
newest, and the committed reference runs under `results/reference/`."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import time
from pathlib import Path

from .. import paths
from ..checks import check_int

KEEP_RUNS_VAR = "FTG_KEEP_RUNS"


def new_run_dir(keep: int | None = None) -> Path:
    """A new `<build>/runs/<date>_<time>[_N]/` (two runs in the same second get two). Finished
    runs beyond the newest `keep` are removed, never one still running (its `run.json`).
    `keep` defaults to `$FTG_KEEP_RUNS`, else 20; 0 keeps every run (a caller that starts one
    suite run per notebook, scripts/gpu_reference_run.sh, must not lose its first ones)."""
    if keep is None:
        text = os.environ.get(KEEP_RUNS_VAR, "").strip() or "20"
        if not text.isdigit():
            raise ValueError(f"{KEEP_RUNS_VAR} must be a whole number >= 0, got {text!r}")
        keep = int(text)
    check_int("keep", keep, 0, where="new_run_dir")
    root = paths.build_dir() / "runs"
    root.mkdir(parents=True, exist_ok=True)
    for old in sorted(root.glob("*/"))[:-keep] if keep else []:
        with contextlib.suppress(OSError, ValueError):
            if json.loads((old / "run.json").read_text()).get("state") in (
                "finished",
                "interrupted",
            ):
                shutil.rmtree(old, ignore_errors=True)
    stamp = time.strftime("%Y-%m-%d_%H%M%S")
    for n in itertools.count():
        d = root / (stamp if n == 0 else f"{stamp}_{n}")
        with contextlib.suppress(FileExistsError):
            d.mkdir()  # atomic: two runs never get the same folder
            return d


def latest_run() -> Path | None:
    """The run folder `<build>/latest` points to (the last `make run` started), or None."""
    link = paths.build_dir() / "latest"
    return link.resolve() if link.is_symlink() and link.resolve().is_dir() else None


def point_latest(run: Path) -> None:
    """Point `<build>/latest` at `run`, atomically (a new link renamed over the old one)."""
    link = paths.build_dir() / "latest"
    tmp = link.with_name(f".latest.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(run, link.parent))
    tmp.replace(link)


def reference_run_dir(device_name: str, date: str | None = None) -> Path:
    """`results/reference/<date>_<device>/`: where one machine's committed run goes."""
    if not isinstance(device_name, str) or not device_name.strip():
        raise ValueError(
            f"reference_run_dir: device_name must be a non-empty string, got {device_name!r}"
        )
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device_name).strip("-")
    return paths.reference_results_dir() / f"{date or time.strftime('%Y-%m-%d')}_{slug}"


def save_reference(results: Path, target: Path | None = None) -> Path:
    """Copy a run's result files to `target` (default: a folder named after its first GPU, else
    its CPU). Not its plots: the report shows a reference run's figures and verdicts only."""
    files = sorted(Path(results).glob("*.json"))
    if not files:
        raise FileNotFoundError(
            f"save_reference: no result files in {results}; run the notebooks first"
        )
    if target is None:
        hw = json.loads(files[0].read_text()).get("hardware", {})
        gpus = hw.get("gpus") or []
        target = reference_run_dir(gpus[0]["name"] if gpus else hw.get("cpu") or "cpu")
    target.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(f, target / f.name)
    return target
