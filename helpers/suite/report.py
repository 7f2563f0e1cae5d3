"""A run's report, `report.md` and a self-contained `report.html`: the machine, verdict counts,
the claims ledger (each notebook's verdict beside the rule, disagreements flagged), the capstone's
waterfall, each notebook's measurements and executed copy, beside the committed reference runs.
`build` gathers the data (tests check it), `_view` lays it out, `templates/` renders it."""

from __future__ import annotations

import base64
import concurrent.futures
import html
import json
import multiprocessing
import os
import re
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from .. import paths
from ..checks import check_choice
from . import catalog, runs
from .claims import CLAIMS, DECIDED, RULES, VERDICT_KINDS, kind_of
from .results import load_all

NOT_RUN = "no verdict recorded"
# by kind
COLOURS = {
    "holds": "#c8e6c9",
    "holds only when": "#fff3c4",
    "does not hold here": "#f8c8c8",
    "mechanism shown": "#cfe3f7",
    "mechanism not shown here": "#f8c8c8",
    NOT_RUN: "#eeeeee",
}


def _fmt(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "" if v is None else str(v)
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _hardware_line(hw: dict[str, Any]) -> str:
    gpus = ", ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in hw.get("gpus", [])) or "no GPU"
    return (
        f"{hw.get('cpu', '?')}, {hw.get('cpu_cores_usable', '?')} cores, "
        f"{hw.get('ram_gib', '?')} GiB RAM; {gpus}; torch {hw.get('torch', '?')}"
    )


def build(
    results: list[dict[str, Any]],
    run_log: dict[str, Any] | None = None,
    references: list[tuple[str, list[dict[str, Any]]]] | None = None,
    problems: list[str] | None = None,
) -> dict[str, Any]:
    """Everything the report shows, as plain data (tests check this; renderers format it).
    `problems`: results files that could not be read (from `load_all(problems=...)`); their
    notebooks' claims read 'results file unreadable', not 'not tested yet'."""
    if not isinstance(results, list) or not all(
        isinstance(r, dict) and "notebook" in r for r in results
    ):
        raise TypeError(
            "build: results must be a list of result dicts, as results.load_all() returns"
        )
    problems = list(problems or [])
    unreadable = {m[1] for m in (re.search(r"(\d\d[a-z]?)_[^/]*\.json ", p) for p in problems) if m}
    if references is None:  # committed GPU results: one folder per run under results/reference/
        references = [
            (d.name, load_all(d, problems=problems))
            for d in sorted(paths.reference_results_dir().glob("*/"))
        ]
    ref_verdicts = _first_in(references, "verdicts", lambda r, v: v["claim"])
    ledger = _ledger(results, unreadable, ref_verdicts)
    counts = Counter(e["kind"] for c in ledger for e in c["entries"])
    return {
        "hardware": results[0]["hardware"] if results else None,
        "notebooks": results,
        "run_log": run_log or {},
        "ledger": ledger,
        "references": references,
        "problems": problems,
        "counts": {k: counts[k] for k in (*VERDICT_KINDS, NOT_RUN) if counts[k]},
    }


def _ledger(
    results: list[dict[str, Any]], unreadable: set[str], ref_verdicts: dict
) -> list[dict[str, Any]]:
    """Per claim: its text, rule, every notebook's verdict (or why none) and the reference's."""
    # the notebooks meant to judge each claim (none without a catalog: notebooks run elsewhere)
    tested_in = catalog.claim_notebooks() if catalog.CATALOG.is_file() else {c: [] for c in CLAIMS}
    ledger = []
    for cid, text in CLAIMS.items():
        entries = _entries(cid, results, tested_in[cid], unreadable)
        decided = {e["kind"] for e in entries if e["kind"] in DECIDED}
        ledger.append(
            {
                "claim": cid,
                "text": text,
                "notebooks": tested_in[cid],
                "entries": entries,
                "disagree": len(decided) > 1,
                "rule": RULES[cid].threshold,
                "other_way": RULES[cid].other_way,
                "kind": RULES[cid].kind,
                "compares": RULES[cid].compares,
                "reference": ref_verdicts.get(cid),
            }
        )
    return ledger


def _entries(
    cid: str, results: list[dict[str, Any]], tested_in: list[str], unreadable: set[str]
) -> list[dict[str, Any]]:
    """Claim `cid`'s verdicts in `results`, then one entry per notebook of `tested_in` (the ones
    meant to judge it) that recorded none."""
    entries = [
        {**v, "notebook": r["notebook"], "kind": kind_of(v["verdict"])}
        for r in results
        for v in r.get("verdicts", [])
        if v.get("claim") == cid
    ]
    recorded = {catalog.number(e["notebook"]) for e in entries}
    # meant to judge it, did not
    entries += [
        {
            "notebook": f"notebook {nb}",
            "kind": NOT_RUN,
            "figure": "",
            "detail": "",
            "synthetic_data": False,
            "verdict": "results file unreadable" if nb in unreadable else NOT_RUN,
        }
        for nb in tested_in
        if nb not in recorded
    ]
    return entries


def _first_in(
    references: list[tuple[str, list[dict[str, Any]]]], field: str, key: Callable
) -> dict:
    """Per `key(result, entry)`, the first reference run's entry of `field`, with that run's
    name."""
    first: dict[Any, dict[str, Any]] = {}
    for name, ref in references:
        for result, x in ((r, x) for r in ref for x in r.get(field, [])):
            first.setdefault(key(result, x), {**x, "run": name})
    return first


def measurements_frame(r: dict[str, Any], ref_idx: dict) -> pd.DataFrame:
    """One notebook's measurements as a table (value, unit, ratio, note, reference run)."""
    rows = []
    for m in r.get("measurements", []):
        ref = ref_idx.get((r["notebook"], m["name"]))
        rows.append(
            {
                "measurement": m["name"],
                "value": _fmt(m["value"]),
                "unit": m["unit"],
                "ratio": f"{m['ratio']:.2f}x" if m.get("ratio") is not None else "",
                "note": m.get("note", ""),
                "reference (GPU)": f"{_fmt(ref['value'])} {ref['unit']} ({ref['run']})"
                if ref
                else "",
            }
        )
    df = pd.DataFrame(
        rows, columns=["measurement", "value", "unit", "ratio", "note", "reference (GPU)"]
    )
    return df if ref_idx else df.drop(columns="reference (GPU)")


def _run_state(log: dict[str, Any]) -> dict[str, Any] | None:
    """Which run, and whether it is complete: a partial report never passes for a finished one."""
    nbs = log.get("notebooks", {})
    return (
        {
            "run": "?",
            "started": "?",
            "profile": "?",
            "profile_reason": "",
            "stopped_by": "a signal",
            "not_run": [],
            "ended": "?",
            **log,
            "done": sum(r.get("status") != "running" for r in nbs.values()),
            "running": [n for n, r in nbs.items() if r.get("status") == "running"],
        }
        if log.get("state")
        else None
    )


def _view(rep: dict[str, Any], results_dir: Path, report_dir: Path | None = None) -> dict[str, Any]:
    """`build`'s data laid out for a report written into `report_dir` (default: the run folder,
    above `results_dir`): links and figure paths relative to it, measurements as pandas tables."""
    results_dir = Path(results_dir)
    report_dir, notebooks_dir = (
        Path(report_dir or results_dir.parent),
        results_dir.parent / "notebooks",
    )
    rel = lambda path: Path(os.path.relpath(path, report_dir)).as_posix()  # noqa: E731

    def figure(f: str) -> dict[str, Any]:
        return {"stem": Path(f).stem, "path": results_dir / f, "rel": rel(results_dir / f)}

    ref_idx = _first_in(rep["references"], "measurements", lambda r, m: (r["notebook"], m["name"]))
    runs = rep["run_log"].get("notebooks", {})
    notebooks = []
    for r in rep["notebooks"]:
        executed, table = notebooks_dir / f"{r['notebook']}.html", measurements_frame(r, ref_idx)
        notebooks.append(
            {
                **r,
                "log": runs.get(r["notebook"]),
                "table": table if len(table) else None,
                "executed": rel(executed) if executed.exists() else None,
                "figures": [figure(f) for f in r.get("figures", [])],
            }
        )
    waterfall = next(
        (f for r in rep["notebooks"] for f in r.get("figures", []) if "waterfall" in f), None
    )
    return {
        **rep,
        "run": _run_state(rep["run_log"]),
        "notebooks": notebooks,
        "machine": _hardware_line(rep["hardware"]) if rep["hardware"] else None,
        "refs": [
            {
                "name": name,
                "machine": _hardware_line(ref[0]["hardware"]),
                "profile": ref[0].get("profile"),
                "date": str(ref[0].get("started", ""))[:10],
            }
            for name, ref in rep["references"]
            if ref
        ],
        "with_refs": any(c["reference"] for c in rep["ledger"]),
        "waterfall": figure(waterfall) if waterfall else None,
        "failed": [(n, v.get("error", "")) for n, v in runs.items() if v.get("status") != "ok"],
    }


def _img(figure: dict[str, Any]) -> str:
    """HTML: a figure inlined into the page (the HTML report is one self-contained file)."""
    try:
        data = base64.b64encode(Path(figure["path"]).read_bytes()).decode()
    except OSError:
        return f"<p>(missing figure {html.escape(Path(figure['path']).name)})</p>"
    return f'<img alt="{html.escape(figure["stem"])}" src="data:image/png;base64,{data}">'


_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("helpers.suite", "templates"),
    autoescape=jinja2.select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
# kinds not in COLOURS (the "needs ..." ones) get the default colour
_TEMPLATES.filters.update(img=_img, fmt=_fmt, colour=lambda kind: COLOURS.get(kind, "#e4daf2"))


def render(rep: dict[str, Any], *where: Path | None, fmt: str = "md") -> str:
    """`rep` as Markdown, or as one self-contained HTML page (figures inlined); `where`: `_view`'s
    folders."""
    check_choice("fmt", fmt, ("md", "html"), where="report.render")
    return _TEMPLATES.get_template(f"report.{fmt}").render(_view(rep, *where))


def render_notebooks(notebooks_dir: Path) -> None:
    """Each executed notebook as a static HTML page next to it (nbconvert's lab template), one
    process per core: the runner renders them once, after the last notebook, so the rendering
    never runs beside a notebook's measurements.

    Without nbconvert (a GPU node given only the runner's wheels) the report is still written:
    the notebooks stay unrendered, and the run's results are not lost to an ImportError."""
    try:
        import nbconvert  # noqa: F401  (each renderer imports it: here, only whether it is there)
    except ImportError:
        warnings.warn(
            "report: nbconvert is not installed: the executed notebooks are not rendered to HTML",
            stacklevel=2,
        )
        return

    if not Path(notebooks_dir).is_dir():
        raise FileNotFoundError(
            f"render_notebooks: notebooks_dir {notebooks_dir} is not a folder of executed notebooks"
        )
    stale = [
        nb_path
        for nb_path in sorted(Path(notebooks_dir).glob("*.ipynb"))
        if not (target := nb_path.with_suffix(".html")).exists()
        or target.stat().st_mtime < nb_path.stat().st_mtime
    ]
    workers = min(len(stale), len(os.sched_getaffinity(0)))
    if workers < 2:
        problems = list(map(_render_one, stale))
    else:  # spawned, not forked: the runner's process has threads (nbclient's, tqdm's)
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=spawn) as pool:
            problems = list(pool.map(_render_one, stale))
    for problem in filter(None, problems):
        print(problem)


def _render_one(nb_path: Path) -> str:
    """Render one executed notebook to HTML beside it; what went wrong, or '' (a broken copy
    must not cost the report)."""
    from nbconvert import HTMLExporter

    try:
        html_text = HTMLExporter(template_name="lab").from_filename(str(nb_path))[0]
        paths.write_atomic(nb_path.with_suffix(".html"), html_text)
    except Exception as err:
        return f"report: could not render {nb_path.name} to HTML ({type(err).__name__}: {err})"
    return ""


def write(
    build_dir: Path | None = None, out_dir: Path | None = None, *, with_notebooks: bool = True
) -> Path:
    """Write `report.md` and `report.html` of a run folder (default: the newest run, else the build
    folder) into `out_dir` (default: that folder), links relative to it; return the HTML path.
    `with_notebooks`: also render the executed notebooks to HTML (`render_notebooks`); the runner
    leaves that to its last report, after every notebook ran."""
    build_dir = Path(build_dir or runs.latest_run() or paths.build_dir())
    if not build_dir.is_dir():
        raise FileNotFoundError(
            f"report.write: build_dir {build_dir} does not exist; run the notebooks "
            "first (make run), or pass the folder that holds results/"
        )
    results_dir, log_path, notebooks = (
        build_dir / "results",
        build_dir / "run.json",
        build_dir / "notebooks",
    )
    problems, run_log = [], {}
    try:
        run_log = json.loads(log_path.read_text()) if log_path.exists() else {}
    except (ValueError, OSError) as e:  # warned once, like an unreadable results file (`load_all`)
        warnings.warn(
            msg := f"{log_path} cannot be read ({e}): notebook statuses are missing", stacklevel=2
        )
        problems.append(msg)
    if with_notebooks and notebooks.is_dir():
        render_notebooks(notebooks)
    rep = build(load_all(results_dir, problems=problems), run_log, problems=problems)
    out_dir = Path(out_dir or build_dir)
    for fmt in ("md", "html"):
        paths.write_atomic(out_dir / f"report.{fmt}", render(rep, results_dir, out_dir, fmt=fmt))
    return out_dir / "report.html"
