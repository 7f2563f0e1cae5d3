"""The capstone benchmark: notebook 19 executed headless, its waterfall written as a table.

    python -m benchmarks.capstone            # `make bench`: full profile on a GPU, smoke on a CPU
    python -m benchmarks.capstone --help

The benchmark *is* the notebook: the book's loop and every change of the fast recipe are the
code in the cells of notebooks/19_capstone.ipynb, executed here by nbclient with the chosen
profile (`--set NAME=VALUE` overrides a parameter, papermill-style: a cell inserted after the
notebook's parameters cell). The table comes from what the notebook recorded. The notebook
asserts that the fast recipe keeps the accuracy (at most one point below the reference), so a
run that loses it fails, and so does this command (exit status 1).

Writes build/results/bench_capstone.{json,md} and the executed notebook beside them, each naming
its profile; a run on a CUDA GPU in the gpu profile (sized by time) or the full one also
results/reference/<date>_<gpu>/ (commit that folder: the report shows it). A smoke run is never a
reference: its sizes measure a CPU's lesson, not the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
import torch

from helpers import devices, paths
from helpers.suite import results, runner, runs

NOTEBOOK = paths.ROOT / "notebooks" / "19_capstone.ipynb"
REFERENCE_PROFILES = ("gpu", "full")  # what results/reference/ holds: a GPU's sizes, not smoke's


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    gpu = devices.accelerator() == "cuda"  # a CUDA GPU this torch runs on
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.capstone", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--profile",
        choices=("smoke", "gpu", "full"),
        default="full" if gpu else "smoke",
        help="the notebook's profile (default: full on a GPU, smoke on a CPU: about a minute; "
        "gpu: the book's model with epochs sized to the notebook's GPU budget)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a parameter of the notebook, e.g. --set ACC_EPOCHS=3 (a Python literal)",
    )
    p.add_argument(
        "--accuracy-epochs", type=int, default=None, help="shorthand for --set ACC_EPOCHS=N"
    )
    p.add_argument("--timeout", type=int, default=1800, help="seconds one cell may run")
    p.add_argument(
        "--reference-dir",
        default=None,
        help="where a GPU run in the gpu or full profile also writes its figures (default "
        "results/reference/<date>_<gpu>)",
    )
    a = p.parse_args(argv)
    if a.accuracy_epochs is not None:
        if a.accuracy_epochs < 1:
            p.error("--accuracy-epochs must be >= 1")
        a.set.append(f"ACC_EPOCHS={a.accuracy_epochs}")
    for item in a.set:
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*=.+", item):
            p.error(f"--set takes NAME=VALUE with an upper-case parameter name, got {item!r}")
    return a


def notebook_with(overrides: list[str]) -> nbformat.NotebookNode:
    """Notebook 19 with a cell setting `overrides` right after its parameters cell."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (i,) = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    if overrides:
        src = "\n".join(overrides) + "\nprint('overridden:', "
        src += ", ".join(repr(o) for o in overrides) + ")"
        # papermill's convention: after the cell tagged `parameters`, one tagged injected-parameters
        injected = nbformat.v4.new_code_cell(src, metadata={"tags": ["injected-parameters"]})
        nb.cells.insert(i + 1, injected)
    return nb


def table(rows: list[dict]) -> str:
    head = [
        "step",
        "kept",
        "s/epoch",
        "spread s",
        "samples/s",
        "x ref",
        "busy %",
        "bound",
        "% of measured matmul",
        "% of peak",
        "note",
    ]
    # by hand: pandas' DataFrame.to_markdown needs `tabulate`, one more dependency for one table
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        lines.append(
            "| "
            + " | ".join(
                [
                    r["step"],
                    "yes" if r["kept"] else "no",
                    f(r["seconds_per_epoch"], ".3f"),
                    f(r["spread_s"], ".3f"),
                    f(r["samples_per_s"], ".0f"),
                    f(r["ratio"], ".2f"),
                    f(r["busy_pct"], ".0f"),
                    r["bound"] or "-",
                    f(r["ceiling_pct"], ".1f"),
                    f(r["peak_pct"], ".1f")
                    + (f" of {r['peak_precision']}" if r["peak_pct"] is not None else ""),
                    r["note"],
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def bench_rows(recorded: dict) -> list[dict]:
    """The notebook's waterfall rows under the benchmark's column names."""
    return [
        {
            "step": r["step"],
            "kept": r["kept"],
            "seconds_per_epoch": r["s / epoch"],
            "spread_s": r["spread s"],
            "samples_per_s": r["samples/s"],
            "ratio": r["x reference"],
            "busy_pct": r["device busy %"],
            "bound": r.get("bound"),  # diagnose.bottleneck's verdict (absent in older runs)
            "ceiling_pct": r.get("% of measured matmul"),
            "peak_pct": r["% of peak"],
            "peak_precision": r["peak precision"],
            "note": r["note"],
            "cuda_graphs_used": r["cuda graphs used"],
        }
        for r in recorded["waterfall"]
    ]


def fp32_line(recorded: dict) -> str:
    """What fp32 meant: the reference keeps PyTorch's defaults; the TF32 bar sets both to TF32."""
    d = recorded.get("fp32_defaults")
    if not d:
        return "- fp32 precision: not recorded (a notebook from before it was)"
    return (
        f"- fp32 precision: the reference keeps PyTorch's defaults, matmuls {d['matmuls']!r} "
        f"('none': inherited 'ieee'), convolutions {d['convolutions']!r} (TF32 on compute "
        "capability 8.0+); the TF32 bar sets both to 'tf32'"
    )


def summary(recorded: dict, rows: list[dict], a: argparse.Namespace, seconds: float) -> str:
    m = {x["name"]: x["value"] for x in recorded["measurements"]}
    name = devices.device_name(devices.try_gpu())
    fast = next(r for r in reversed(rows) if r["kept"])
    detail = "; ".join(s["detail"] for s in recorded["data_sources"].values())
    ref_acc, fast_acc = m.get("reference test accuracy"), m.get("fast recipe test accuracy")
    return "\n".join(
        [
            f"# Capstone benchmark: {name}, {a.profile} profile",
            "",
            f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}; torch {torch.__version__}; "
            f"notebook 19, profile {a.profile}"
            + (f", overridden: {', '.join(a.set)}" if a.set else ""),
            f"- data: {detail}",
            f"- model: d2l ResNet-18; {recorded['gflop_per_image']:.3f} GFLOP per training image "
            "(torch.utils.flop_counter, forward + backward)",
            "- timing: one untimed warm-up epoch, then the median of the timed epochs per step; "
            "a step is kept when it beats the best so far by more than 2 % and the spread",
            fp32_line(recorded),
            "",
            table(rows),
            "",
            f"**fast recipe**: {fast['step']} stack, {fast['seconds_per_epoch']:.3f} s/epoch, "
            f"{fast['ratio']:.2f}x the reference",
            f"\n**accuracy**: reference {ref_acc:.4f}, fast {fast_acc:.4f} "
            f"({100 * (fast_acc - ref_acc):+.2f} pp)"
            + (
                " - SYNTHETIC data"
                if any(s["synthetic"] for s in recorded["data_sources"].values())
                else ""
            ),
            f"\ntotal benchmark time {seconds:.0f} s",
        ]
    )


def save(recorded: dict, rows: list[dict], text: str, a: argparse.Namespace) -> None:
    targets = [paths.results_dir()]
    if devices.accelerator() == "cuda" and a.profile in REFERENCE_PROFILES:
        name = devices.device_name(devices.try_gpu())
        targets.append(Path(a.reference_dir) if a.reference_dir else runs.reference_run_dir(name))
    elif devices.accelerator() == "cuda":
        print(f"not written to results/reference/: a {a.profile} run is no GPU reference")
    for target in targets:
        record = results.Recorder("bench_capstone", profile=a.profile, directory=target)
        record.data["data_sources"] = recorded["data_sources"]
        for row in rows:
            if row["seconds_per_epoch"] is not None:
                record.measure(
                    f"bench: {row['step']} s/epoch",
                    row["seconds_per_epoch"],
                    "s",
                    ratio=row["ratio"],
                    note="x reference",
                    quiet=True,
                    kept=row["kept"],
                    busy_pct=row["busy_pct"],
                    bound=row["bound"],
                    peak_pct=row["peak_pct"],
                    peak_precision=row["peak_precision"],
                    samples_per_s=row["samples_per_s"],
                    spread_s=row["spread_s"],
                    cuda_graphs_used=row["cuda_graphs_used"],
                )
        for m in recorded["measurements"]:
            if m["name"].endswith("test accuracy"):
                record.measure(f"bench: {m['name']}", m["value"], "", quiet=True)
        record.data["bench_table"] = rows
        record.data["bench_args"] = vars(a)
        record.save()
        (target / "bench_capstone.md").write_text(text + "\n")
        print(f"written: {target / 'bench_capstone.md'}")


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    t0 = time.perf_counter()
    work = paths.results_dir() / "bench_capstone_run"
    work.mkdir(parents=True, exist_ok=True)
    (work / "19_capstone.json").unlink(missing_ok=True)
    nb_path = work / NOTEBOOK.name
    nbformat.write(notebook_with(a.set), nb_path)
    saved = {k: os.environ.get(k) for k in ("FTG_PROFILE", "FTG_RESULTS_DIR")}
    os.environ.update(FTG_PROFILE=a.profile, FTG_RESULTS_DIR=str(work))  # the kernel inherits both
    print(f"Capstone benchmark: executing notebook 19 ({a.profile} profile) in {work}")
    try:
        out = runner.execute(nb_path, work, a.timeout)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    if out["status"] != "ok":
        print(f"FAIL: notebook 19 {out['status']}: {out['error']} (executed copy: {nb_path})")
        return 1
    recorded = json.loads((work / "19_capstone.json").read_text())
    rows = bench_rows(recorded)
    text = summary(recorded, rows, a, time.perf_counter() - t0)
    print(text)
    save(recorded, rows, text, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
