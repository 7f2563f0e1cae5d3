"""Execute the whole suite headless, in order, into `build/notebooks/`, then write the report.

    python -m helpers.suite --profile auto     # what `make run` does

Executed copies go to the build folder; the sources in `notebooks/` are never modified.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError
from tqdm.auto import tqdm

from . import paths, profiles, report

NOTEBOOKS = paths.ROOT / "notebooks"


def notebook_paths(pattern: str = "*") -> list[Path]:
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"notebook_paths: pattern must be a glob of notebook names such as '0[01]_*', "
                         f"got {pattern!r}")
    return sorted(p for p in NOTEBOOKS.glob(f"{pattern}.ipynb") if p.stem[:2].isdigit())


def execute(nb_path: Path, out_dir: Path, timeout: int) -> dict:
    """Run one notebook in a fresh kernel (cwd = notebooks/) and save the executed copy."""
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 1:
        raise ValueError(f"execute: timeout must be a positive int (seconds per cell), got {timeout!r}")
    nb_path, out_dir = Path(nb_path), Path(out_dir)
    if not nb_path.is_file():
        raise FileNotFoundError(f"execute: nb_path {nb_path} is not a notebook file")
    out_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(nb_path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    t0 = time.perf_counter()
    status, error = "ok", ""
    try:
        client.execute()
    except CellExecutionError as e:
        status, error = "failed", f"{e.ename}: {e.evalue}"[:500]
    except CellTimeoutError as e:
        status, error = "failed", f"cell timed out after {timeout} s: {str(e)[:200]}"
    seconds = time.perf_counter() - t0
    nbformat.write(nb, out_dir / nb_path.name)
    return {"status": status, "seconds": round(seconds, 1), "error": error}


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
        target = paths.reference_run_dir(gpus[0]["name"] if gpus else hw.get("cpu") or "cpu")
    target.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(f, target / f.name)
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="auto", help="smoke, full or auto (default: auto)")
    ap.add_argument("--notebooks", default="*", help="glob of notebook names, e.g. '0[01]_*'")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds allowed per cell")
    ap.add_argument("--save-reference", action="store_true",
                    help="also copy this run's results to results/reference/<date>_<device>/ "
                         "(on a GPU: commit that folder so every report shows it)")
    args = ap.parse_args(argv)
    profile = profiles.resolve(args.profile)
    os.environ[profiles.ENV_VAR] = profile  # the kernels inherit it
    # Inline, whatever the caller set (a shell with MPLBACKEND=Agg would leave the copies without plots).
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # keep the profiler's C++ logging out of the progress
    build = paths.build_dir()
    out_dir = build / "notebooks"
    shutil.rmtree(paths.results_dir(), ignore_errors=True)  # the report shows this run only
    out_dir.mkdir(parents=True, exist_ok=True)
    nbs = notebook_paths(args.notebooks)
    if not nbs:
        print(f"no notebooks match {args.notebooks!r}", file=sys.stderr)
        return 2
    print(f"Running {len(nbs)} notebooks in the '{profile}' profile; executed copies -> {out_dir}")
    log = {"profile": profile, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "notebooks": {}}
    bar = tqdm(nbs, unit="notebook")
    for nb_path in bar:
        bar.set_description(nb_path.stem)
        res = execute(nb_path, out_dir, args.timeout)
        log["notebooks"][nb_path.stem] = res
        tqdm.write(f"  {nb_path.stem}: {res['status']} in {res['seconds']:.0f} s {res['error']}")
        (build / "run.json").write_text(json.dumps(log, indent=1))
    failed = [n for n, r in log["notebooks"].items() if r["status"] != "ok"]
    if args.save_reference:
        if failed:
            print("not saved as a reference run: some notebooks failed", file=sys.stderr)
        else:
            print(f"reference results: {save_reference(paths.results_dir())}")
    html_path = report.write(build)
    print(f"\nReport: {html_path}\n        {html_path.with_suffix('.md')}")
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(failed)} (executed copies show where)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
