"""Execute the notebooks headless, in order, then write the report.

    python -m helpers.suite --profile auto     # what `make run` does

Each run gets its own folder, `build/runs/<date>_<time>/` (executed copies, `results/`, `run.json`,
the report, rewritten after every notebook; `build/latest` and `build/report.*`: the newest run);
sources are never modified. A notebook that fails (cell error, timeout, a dead kernel) is recorded
with its reason and partly executed copy, and the next one runs. Ctrl-C or SIGTERM end the running
kernel and all it started; the report of what finished is marked interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbclient.output_widget import OutputWidget
from tqdm.auto import tqdm

from .. import paths, processes, profiles
from ..checks import check_int
from . import report, runs

NOTEBOOKS = paths.ROOT / "notebooks"
save_reference = runs.save_reference  # `--save-reference`, and tests
_stopped_by: list[int] = []  # the signal that asked the run to stop (empty while it goes on)
_ours_before: set[int] = set()  # processes the caller ran before main(): never ours to end


def notebook_paths(pattern: str = "*", source: Path | None = None) -> list[Path]:
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(
            f"notebook_paths: pattern must be a glob of notebook names such as '0[01]_*', "
            f"got {pattern!r}"
        )
    return sorted(
        p for p in Path(source or NOTEBOOKS).glob(f"{pattern}.ipynb") if p.stem[:2].isdigit()
    )


def _death(kernel: list[Any]) -> str:
    code = kernel[0].poll() if kernel and kernel[0] is not None else None
    if code is None or code >= 0:
        return "the kernel died" + ("" if code is None else f": it exited with status {code}")
    sig = {s.value: s.name for s in signal.Signals}.get(-code, f"signal {-code}")
    hint = " (the out-of-memory killer, or a kill -9)" if -code == signal.SIGKILL else ""
    return f"the kernel died: killed by {sig}{hint}"


def execute(nb_path: Path, out_dir: Path, timeout: int) -> dict:
    """Run one notebook in a fresh kernel (cwd: its folder), save the executed copy, finished or
    not, and return its status ('ok', 'failed', 'interrupted'), seconds and why: never raises for a
    failing notebook. The kernel's own stderr goes to `<out_dir>/<name>.kernel.log`."""
    check_int("timeout (seconds per cell)", timeout, 1, where="execute")
    nb_path, out_dir = Path(nb_path), Path(out_dir)
    if not nb_path.is_file():
        raise FileNotFoundError(f"execute: nb_path {nb_path} is not a notebook file")
    out_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(nb_path, as_version=4)
    kernel: list[Any] = []  # the kernel process: its exit status says how it died
    client = _client(nb, nb_path, timeout, kernel)
    outcome: dict[str, Any] = {"status": "ok", "error": ""}
    t0 = time.perf_counter()
    # nbclient in a thread: the main one keeps our signal handlers
    # (nbclient's kill the kernel mid-cell)
    worker = threading.Thread(
        target=_run_client,
        args=(client, out_dir / f"{nb_path.stem}.kernel.log", timeout, kernel, outcome),
        name=f"nbclient {nb_path.stem}",
        daemon=True,
    )
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
    if _stopped_by:
        outcome.update(
            status="interrupted",
            error=f"stopped by {signal.Signals(_stopped_by[0]).name}; "
            "the cell running then did not finish",
        )
    if outcome["status"] != "ok":  # say so at the top of the executed copy
        nb.cells.insert(
            0,
            nbformat.v4.new_markdown_cell(
                f"**This run of the notebook {outcome['status']}**: {outcome['error']}"
            ),
        )
    nbformat.write(nb, out_dir / nb_path.name)
    return {**outcome, "seconds": round(time.perf_counter() - t0, 1)}


class HeadlessOutputWidget(OutputWidget):
    """nbclient's stand-in for a front end's Output widget (the one `interact` draws into),
    minus the state it sends back to the kernel. It sends that on the shell channel while
    nbclient waits on the same channel for the cell's reply, and now and then the reply is not
    seen until the cell's timeout (jupyter/nbclient#312, open): notebook 19's cost widget once
    held a run for its 30-minute cell timeout, and 40 `interact` cells took 33-63 s with it, 3 s
    without. Headless, the kernel never needs the widget's outputs back; nbclient still records
    them in the executed copy."""

    def sync_state(self) -> None:
        pass


def headless_client(nb: Any, **kwargs: Any) -> NotebookClient:
    """`NotebookClient(nb, **kwargs)` whose Output widgets send nothing back to the kernel
    (`HeadlessOutputWidget`): the runner, the benchmark and the tests that run the suite's
    notebooks headless use it."""
    if not isinstance(nb, nbformat.NotebookNode):
        raise TypeError(
            f"headless_client: nb must be a notebook (nbformat.read(...)), got {type(nb).__name__}"
        )
    client = NotebookClient(nb, **kwargs)
    client.widget_registry["@jupyter-widgets/output"]["OutputModel"] = HeadlessOutputWidget
    return client


def _client(nb: Any, nb_path: Path, timeout: int, kernel: list[Any]) -> NotebookClient:
    """An nbclient for `nb` (cwd: `nb_path`'s folder); it appends its kernel process to
    `kernel`."""
    client = headless_client(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(nb_path.parent.resolve())}},
        on_notebook_start=lambda **_: kernel.append(
            getattr(client.km.provisioner, "process", None)
        ),
    )
    return client


def _run_client(
    client: NotebookClient,
    log_path: Path,
    timeout: int,
    kernel: list[Any],
    outcome: dict[str, Any],
) -> None:
    """Execute `client`'s notebook, the kernel's output into `log_path`; a failure goes into
    `outcome` (status and error), never raised."""
    try:
        with open(log_path, "w") as log:
            try:
                client.execute(stdout=log, stderr=log)
            except RuntimeError as e:
                # died before any cell: another process took a port picked for it
                # (jupyter_client binds, then releases them)
                if "kernel_info" not in str(e):
                    raise
                client.execute(stdout=log, stderr=log)  # once more: a new kernel, new ports
    except CellExecutionError as e:
        outcome.update(status="failed", error=f"{e.ename}: {e.evalue}"[:500])
    except CellTimeoutError as e:
        outcome.update(status="failed", error=f"cell timed out after {timeout} s: {str(e)[:200]}")
    except DeadKernelError:
        outcome.update(status="failed", error=_death(kernel))
    except BaseException as e:  # anything else nbclient or the kernel manager raise
        outcome.update(status="failed", error=f"{type(e).__name__}: {e}"[:500])


def _on_signal(signum: int, frame: Any) -> None:
    """Ctrl-C / SIGTERM: end the running kernel and all it started (recorded as interrupted)."""
    if not _stopped_by:
        _stopped_by.append(signum)
        print(
            f"\n{signal.Signals(signum).name}: stopping; "
            "ending the running kernel and its processes...",
            file=sys.stderr,
            flush=True,
        )
    processes.end_tree(processes.started_since(_ours_before), grace=2.0)


def choose_profile(cli: str | None) -> tuple[str, str]:
    """The profile to run (smoke or full) and why: `--profile`, else `$FTG_PROFILE`, else auto."""
    return profiles.choose(cli or None, "asked for with --profile (make run PROFILE=...)")


def _confirm_full(yes: bool) -> bool:
    """The full profile runs the paper sizes: say so before it starts; without a GPU it takes
    hours, so go on there only when the user says so."""
    from ..devices import accelerator  # imports torch: only when a full run is asked for

    print(
        "The 'full' profile runs the paper sizes (50,000 images written and decoded, epochs of "
        "the whole data set, every capstone bar): long. The capstone benchmark alone took 216 s "
        "on an H100 (results/reference/); a T4 takes several times as long per notebook. The "
        "default on a GPU is the 'gpu' profile, sized to end within its budget "
        "(notebooks/catalog.toml)."
    )
    if yes or accelerator() is not None:
        return True
    msg = (
        "The 'full' profile on a machine without a GPU runs the real sizes on the CPU: "
        "this takes hours."
    )
    if sys.stdin is not None and sys.stdin.isatty():
        return input(f"{msg} Go on? [y/N] ").strip().lower() in ("y", "yes")
    print(
        f"{msg} Not started: pass --yes (make run PROFILE=full CONFIRM=1) to run it anyway.",
        file=sys.stderr,
    )
    return False


def _publish(run: Path, log: dict, *, last: bool = False) -> Path:
    """run.json and the run's report, also written (not copied: links are relative) to build/.
    `last`: the run is over, so the executed notebooks are rendered to HTML now, on every core,
    with no notebook measuring beside them."""
    paths.write_atomic(run / "run.json", json.dumps(log, indent=1))
    report.write(run, out_dir=paths.build_dir(), with_notebooks=last)
    return report.write(run, with_notebooks=False)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m helpers.suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--profile", help="smoke, gpu, full or auto (default: $FTG_PROFILE, else auto)")
    ap.add_argument("--yes", action="store_true", help="run the full profile even without a GPU")
    ap.add_argument("--notebooks", default="*", help="glob of notebook names, e.g. '0[01]_*'")
    ap.add_argument(
        "--source", type=Path, help="folder of the notebooks (default: the repository's)"
    )
    ap.add_argument("--timeout", type=int, default=1800, help="seconds allowed per cell")
    ap.add_argument(
        "--save-reference",
        action="store_true",
        help="also copy the results to "
        "results/reference/<date>_<device>/ (on a GPU: commit it, every report shows it)",
    )
    return ap.parse_args(argv)


def _run_all(nbs: list[Path], run: Path, log: dict[str, Any], timeout: int) -> None:
    """Each notebook in turn into `run`, the report after each; stops at a signal."""
    for nb_path in (bar := tqdm(nbs, unit="notebook")):
        if _stopped_by:
            break
        bar.set_description(nb_path.stem)
        log["notebooks"][nb_path.stem] = {"status": "running"}
        _publish(run, log)
        res = execute(nb_path, run / "notebooks", timeout)
        # workers or ranks the notebook left (not the processes the caller had started)
        left = processes.end_tree(processes.started_since(_ours_before), grace=2.0)
        if left and res["status"] == "ok":
            res["note"] = f"{len(left)} process(es) it left running were ended"
        log["notebooks"][nb_path.stem] = res
        tqdm.write(f"  {nb_path.stem}: {res['status']} in {res['seconds']:.0f} s {res['error']}")
        _publish(run, log)
    bar.close()


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    profile, why = choose_profile(args.profile)
    nbs = notebook_paths(args.notebooks, args.source)
    if not nbs:
        print(f"no notebooks match {args.notebooks!r}", file=sys.stderr)
        return 2
    print(f"Profile: {profile} ({why})")
    if profile == "full" and not _confirm_full(args.yes):
        return 2
    run = runs.new_run_dir()
    kernel_env = {
        profiles.ENV_VAR: profile,  # the kernels inherit it
        # inline, whatever the caller set (MPLBACKEND=Agg would leave the copies without plots)
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        **processes.QUIET_PROFILER,  # the profiler's C++ log lines out of the copies
        "FTG_RESULTS_DIR": str(run / "results"),  # the kernels record into this run's folder
    }
    with _environ(kernel_env):
        return _run(args, nbs, profile, why, run)


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ inside the block (the kernels inherit them), the caller's after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run(args: argparse.Namespace, nbs: list[Path], profile: str, why: str, run: Path) -> int:
    """The run itself, in `run`'s folder; the exit status."""
    runs.point_latest(run)
    print(f"Running {len(nbs)} notebooks; this run's folder: {run}")
    log: dict[str, Any] = {
        "profile": profile,
        "profile_reason": why,
        "run": run.name,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "state": "running",
        "notebooks": {},
    }
    _publish(run, log)  # from now on build/report.* describe this run, never the one before
    _ours_before.clear()
    _ours_before.update(processes.descendants())
    in_main = threading.current_thread() is threading.main_thread()
    old = (
        {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        if in_main
        else {}
    )
    try:
        with processes.subreaper():  # ranks orphaned by a dying kernel stay ours to end
            _run_all(nbs, run, log, args.timeout)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        stopped = _stopped_by[0] if _stopped_by else None
        log.update(
            state="interrupted" if stopped else "finished",
            ended=time.strftime("%Y-%m-%d %H:%M:%S"),
            not_run=[p.stem for p in nbs if p.stem not in log["notebooks"]],
            **({"stopped_by": signal.Signals(stopped).name} if stopped else {}),
        )
        html_path = _publish(run, log, last=True)
        _stopped_by.clear()
    return _summary(log, html_path, stopped, run if args.save_reference else None)


def _summary(
    log: dict[str, Any], html_path: Path, stopped: int | None, reference_of: Path | None
) -> int:
    """Say where the report is and what failed; the exit status of the run."""
    print(
        f"\nReport: {html_path}\n        {html_path.with_suffix('.md')}\n"
        f"        (copied to {paths.build_dir() / 'report.html'})"
    )
    failed = [n for n, r in log["notebooks"].items() if r["status"] != "ok"]
    if stopped:
        finished = len(log["notebooks"]) - len(failed)
        print(
            f"Interrupted by {log['stopped_by']}: {finished} notebook(s) finished, "
            f"not run: {', '.join(log['not_run']) or 'none'}"
        )
        return 128 + stopped
    if reference_of is not None and failed:
        print("not saved as a reference run: some notebooks failed", file=sys.stderr)
    elif reference_of is not None:
        print(f"reference results: {save_reference(reference_of / 'results')}")
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(failed)} (executed copies show where)")
        return 1
    return 0
