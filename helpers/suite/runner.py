"""Execute the whole suite headless, in order, then write the report.

    python -m helpers.suite --profile auto     # what `make run` does

Each run gets its own folder, `build/runs/<date>_<time>/` (executed copies in `notebooks/`,
measurements in `results/`, `run.json`, the report), and `build/latest` points to the newest;
`build/report.{html,md}` are copies of its report, rewritten after every notebook. So a second
run, `make test` or a run in progress never overwrite each other's results. The sources in
`notebooks/` are never modified.

A notebook that fails in any way (a cell error, a cell timeout, a kernel that dies or is killed
for memory) is recorded as failed, with its reason and its partly executed copy, and the next
one runs. Ctrl-C or SIGTERM stop the run: the running kernel and everything it started end,
and the report of what finished is written, marked as interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from tqdm.auto import tqdm

from .. import paths, processes, profiles
from ..checks import check_int
from . import report

NOTEBOOKS = paths.ROOT / "notebooks"
KEEP_RUNS = 20  # older finished run folders are pruned


class _Stop:
    """The signal that asked the run to stop (None while it goes on)."""

    signum: int | None = None


def notebook_paths(pattern: str = "*", source: Path | None = None) -> list[Path]:
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"notebook_paths: pattern must be a glob of notebook names such as '0[01]_*', "
                         f"got {pattern!r}")
    return sorted(p for p in Path(source or NOTEBOOKS).glob(f"{pattern}.ipynb") if p.stem[:2].isdigit())


class _Client(NotebookClient):
    """nbclient's client, remembering the kernel process (its exit status says how it died)."""

    kernel_process: Any = None

    async def async_start_new_kernel(self, **kwargs: Any) -> None:
        await super().async_start_new_kernel(**kwargs)
        self.kernel_process = getattr(self.km.provisioner, "process", None)


def _death(client: _Client) -> str:
    proc = client.kernel_process
    code = proc.poll() if proc is not None else None
    if code is not None and code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        hint = " (the out-of-memory killer, or a kill -9)" if -code == signal.SIGKILL else ""
        return f"the kernel died: killed by {sig}{hint}"
    if code is not None:
        return f"the kernel died: it exited with status {code}"
    return "the kernel died"


def execute(nb_path: Path, out_dir: Path, timeout: int) -> dict:
    """Run one notebook in a fresh kernel (cwd = the notebook's folder) and save the executed
    copy, finished or not. Never raises for a failing notebook: returns its status
    ('ok', 'failed' or 'interrupted'), seconds and the reason. The kernel's own stderr (C++
    library logging, ipykernel's warnings) goes to `<out_dir>/<name>.kernel.log`."""
    check_int("timeout (seconds per cell)", timeout, 1, where="execute")
    nb_path, out_dir = Path(nb_path), Path(out_dir)
    if not nb_path.is_file():
        raise FileNotFoundError(f"execute: nb_path {nb_path} is not a notebook file")
    out_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(nb_path, as_version=4)
    client = _Client(nb, timeout=timeout, kernel_name="python3",
                     resources={"metadata": {"path": str(nb_path.parent.resolve())}})
    outcome: dict[str, Any] = {"status": "ok", "error": ""}
    log_path = out_dir / f"{nb_path.stem}.kernel.log"

    def run() -> None:
        try:
            with open(log_path, "w") as log:
                client.execute(stdout=log, stderr=log)
        except CellExecutionError as e:
            outcome.update(status="failed", error=f"{e.ename}: {e.evalue}"[:500])
        except CellTimeoutError as e:
            outcome.update(status="failed", error=f"cell timed out after {timeout} s: {str(e)[:200]}")
        except DeadKernelError:
            outcome.update(status="failed", error=_death(client))
        except BaseException as e:  # anything else nbclient or the kernel manager raise
            outcome.update(status="failed", error=f"{type(e).__name__}: {e}"[:500])

    t0 = time.perf_counter()
    # nbclient runs in a thread of its own, so that this (main) thread keeps the signal
    # handlers: nbclient's own, in its event loop, tear the kernel down under a running cell.
    worker = threading.Thread(target=run, name=f"nbclient {nb_path.stem}", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
    if _Stop.signum is not None:
        outcome.update(status="interrupted",
                       error=f"stopped by {signal.Signals(_Stop.signum).name}; the cell running then did not finish")
    seconds = time.perf_counter() - t0
    if outcome["status"] != "ok":  # say so at the top of the executed copy
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(
            f"**This run of the notebook {outcome['status']}**: {outcome['error']}"))
    nbformat.write(nb, out_dir / nb_path.name)
    return {"status": outcome["status"], "seconds": round(seconds, 1), "error": outcome["error"]}


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


def _on_signal(signum: int, frame: Any) -> None:
    """Ctrl-C / SIGTERM: stop after ending the running notebook's kernel and everything it
    started (the notebook then fails at once and is recorded as interrupted)."""
    first = _Stop.signum is None
    _Stop.signum = _Stop.signum or signum
    if first:
        print(f"\n{signal.Signals(signum).name}: stopping; ending the running kernel and its processes...",
              file=sys.stderr, flush=True)
    processes.end_tree(grace=2.0)


def choose_profile(cli: str | None) -> tuple[str, str]:
    """The profile to run (smoke or full) and why: `--profile`, else `$FTG_PROFILE`, else auto."""
    if cli:
        name, why = cli, "asked for with --profile (make run PROFILE=...)"
    elif os.environ.get(profiles.ENV_VAR):
        name, why = os.environ[profiles.ENV_VAR], f"from the environment ({profiles.ENV_VAR})"
    else:
        name, why = "auto", "the default"
    resolved = profiles.resolve(name)
    if name.strip().lower() == "auto":
        why += f", auto: {'a CUDA GPU is present' if resolved == 'full' else 'no CUDA GPU here'}"
    return resolved, why


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch.backends, "mps") and torch.backends.mps.is_available())


def _confirm_full(yes: bool) -> bool:
    """A full run without a GPU takes hours: go on only when the user says so."""
    if yes or _has_gpu():
        return True
    msg = ("The 'full' profile on a machine without a GPU runs the real sizes on the CPU: "
           "this takes hours.")
    if sys.stdin is not None and sys.stdin.isatty():
        answer = input(f"{msg} Go on? [y/N] ")
        return answer.strip().lower() in ("y", "yes")
    print(f"{msg} Not started: pass --yes (make run PROFILE=full CONFIRM=1) to run it anyway.",
          file=sys.stderr)
    return False


def _prune_runs(keep: int = KEEP_RUNS) -> None:
    """Keep the newest `keep` run folders; never one that is still running."""
    root = paths.runs_dir()
    runs = sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
    for old in runs[:-keep]:
        try:
            state = json.loads((old / "run.json").read_text()).get("state")
        except (OSError, ValueError):
            state = None
        if state in ("finished", "interrupted"):
            shutil.rmtree(old, ignore_errors=True)


def _publish(run: Path, log: dict) -> Path:
    """Write run.json and the run's report, and the same report as build/report.{md,html}
    (written there, not copied: its links are relative to the folder it is in)."""
    paths.write_atomic(run / "run.json", json.dumps(log, indent=1))
    html_path = report.write(run)
    report.write(run, out_dir=paths.build_dir())
    return html_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m helpers.suite", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=None,
                    help="smoke, full or auto (default: $FTG_PROFILE, else auto)")
    ap.add_argument("--yes", action="store_true", help="run the full profile even without a GPU")
    ap.add_argument("--notebooks", default="*", help="glob of notebook names, e.g. '0[01]_*'")
    ap.add_argument("--source", type=Path, default=None,
                    help="folder of the notebooks to run (default: the repository's notebooks/)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds allowed per cell")
    ap.add_argument("--save-reference", action="store_true",
                    help="also copy this run's results to results/reference/<date>_<device>/ "
                         "(on a GPU: commit that folder so every report shows it)")
    args = ap.parse_args(argv)
    profile, why = choose_profile(args.profile)
    nbs = notebook_paths(args.notebooks, args.source)
    if not nbs:
        print(f"no notebooks match {args.notebooks!r}", file=sys.stderr)
        return 2
    print(f"Profile: {profile} ({why})")
    if profile == "full" and not _confirm_full(args.yes):
        return 2
    os.environ[profiles.ENV_VAR] = profile  # the kernels inherit it
    # Inline, whatever the caller set (a shell with MPLBACKEND=Agg would leave the copies without plots).
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # keep the profiler's C++ logging out of the progress
    run = paths.new_run_dir()
    os.environ["FTG_RESULTS_DIR"] = str(run / "results")  # the kernels record into this run's folder
    out_dir = run / "notebooks"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths.point_latest(run)
    _prune_runs()
    print(f"Running {len(nbs)} notebooks; this run's folder: {run}")
    log: dict[str, Any] = {"profile": profile, "profile_reason": why, "run": run.name,
                           "started": time.strftime("%Y-%m-%d %H:%M:%S"), "state": "running",
                           "notebooks": {}}
    _publish(run, log)  # from now on build/report.* describe this run, never the one before
    processes.become_subreaper()  # ranks orphaned by a dying kernel stay ours to end
    in_main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
    _Stop.signum = None
    try:
        bar = tqdm(nbs, unit="notebook")
        for nb_path in bar:
            if _Stop.signum is not None:
                break
            bar.set_description(nb_path.stem)
            log["notebooks"][nb_path.stem] = {"status": "running"}
            _publish(run, log)
            res = execute(nb_path, out_dir, args.timeout)
            left = processes.end_tree(grace=2.0)  # workers or ranks the notebook left
            if left and res["status"] == "ok":
                res["note"] = f"{len(left)} process(es) it left running were ended"
            log["notebooks"][nb_path.stem] = res
            tqdm.write(f"  {nb_path.stem}: {res['status']} in {res['seconds']:.0f} s {res['error']}")
            _publish(run, log)
        bar.close()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        stopped = _Stop.signum
        log["state"] = "interrupted" if stopped else "finished"
        if stopped:
            log["stopped_by"] = signal.Signals(stopped).name
        log["not_run"] = [p.stem for p in nbs if p.stem not in log["notebooks"]]
        log["ended"] = time.strftime("%Y-%m-%d %H:%M:%S")
        html_path = _publish(run, log)
        _Stop.signum = None
    print(f"\nReport: {html_path}\n        {html_path.with_suffix('.md')}\n"
          f"        (copied to {paths.build_dir() / 'report.html'})")
    failed = [n for n, r in log["notebooks"].items() if r["status"] != "ok"]
    if stopped:
        print(f"Interrupted by {log['stopped_by']}: {len(log['notebooks']) - len(failed)} notebook(s) finished, "
              f"not run: {', '.join(log['not_run']) or 'none'}")
        return 128 + stopped
    if args.save_reference:
        if failed:
            print("not saved as a reference run: some notebooks failed", file=sys.stderr)
        else:
            print(f"reference results: {save_reference(run / 'results')}")
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(failed)} (executed copies show where)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
