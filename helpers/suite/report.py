"""Turn recorded results into a report: `report.html` (self-contained, coloured) and `report.md`.

At the top: the machine, a count of verdicts by kind, and the claims ledger coloured by verdict,
each claim with every notebook's verdict (disagreements flagged) and the rule behind it; then the
capstone's waterfall; then each notebook's measurements, with a link to its executed copy
rendered by nbconvert. Reference results committed from GPU runs stand beside this machine's.
`build` gathers the data (tests check it); `to_markdown` and `to_html` only render it.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from .. import paths
from . import catalog
from .claims import CLAIMS, RULES, VERDICT_KINDS, kind_of
from .results import load_all

NOT_RUN = "no verdict recorded"
# colours by verdict kind (background of the verdict cell)
COLOURS = {"holds": "#c8e6c9", "holds only when": "#fff3c4", "does not hold here": "#f8c8c8",
           "advice": "#cfe3f7", NOT_RUN: "#eeeeee"}
NEEDS_COLOUR = "#e4daf2"
DECIDED = ("holds", "holds only when", "does not hold here", "advice")


def _fmt(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "" if v is None else str(v)
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _cell(v: Any) -> str:
    """Text for a Markdown table cell: a `|` in a name would end the cell, so it is escaped."""
    return str(v).replace("|", "\\|").replace("\n", " ")


def _run_lines(log: dict[str, Any]) -> list[str]:
    """Which run this is and whether it is complete: a report never passes for a finished
    run when it is not."""
    if not log.get("state"):
        return []
    nbs = log.get("notebooks", {})
    done = [n for n, r in nbs.items() if r.get("status") != "running"]
    line = (f"**Run** `{log.get('run', '?')}`, started {log.get('started', '?')}, profile "
            f"{log.get('profile', '?')} ({log.get('profile_reason', '')}): ")
    state = log["state"]
    if state == "running":
        running = [n for n, r in nbs.items() if r.get("status") == "running"]
        line += (f"**IN PROGRESS** - {len(done)} notebook(s) done"
                 + (f", running {', '.join(running)}" if running else "") + "; this report is partial.")
    elif state == "interrupted":
        line += (f"**INTERRUPTED** by {log.get('stopped_by', 'a signal')} after {len(done)} notebook(s); "
                 f"not run: {', '.join(log.get('not_run', [])) or 'none'}. This report is partial.")
    else:
        line += f"finished, {len(done)} notebook(s), ended {log.get('ended', '?')}."
    return [line, ""]


def _hardware_line(hw: dict[str, Any]) -> str:
    gpus = ", ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in hw.get("gpus", [])) or "no GPU"
    return (f"{hw.get('cpu', '?')}, {hw.get('cpu_cores_usable', '?')} cores, {hw.get('ram_gib', '?')} GiB RAM; "
            f"{gpus}; torch {hw.get('torch', '?')}")


def _reference_sets(problems: list[str] | None = None) -> list[tuple[str, list[dict[str, Any]]]]:
    """Committed GPU results: one folder per run under results/reference/."""
    root = paths.reference_results_dir()
    if not root.exists():
        return []
    return [(d.name, load_all(d, problems=problems)) for d in sorted(root.iterdir()) if d.is_dir()]


def build(results: list[dict[str, Any]], run_log: dict[str, Any] | None = None,
          references: list[tuple[str, list[dict[str, Any]]]] | None = None,
          problems: list[str] | None = None) -> dict[str, Any]:
    """Everything the report shows, as plain data (tests check this; renderers format it).
    `problems`: results files that could not be read (from `load_all(problems=...)`); their
    notebooks' claims read 'results file unreadable', not 'not tested yet'."""
    if not isinstance(results, list) or not all(isinstance(r, dict) and "notebook" in r for r in results):
        raise TypeError("build: results must be a list of result dicts, as results.load_all() returns")
    problems = list(problems or [])
    own_problems = list(problems)  # this machine's files (reference files are added below)
    references = _reference_sets(problems) if references is None else references
    ref_verdicts: dict[str, dict[str, Any]] = {}
    for name, ref in references:
        for r in ref:
            for v in r.get("verdicts", []):
                ref_verdicts.setdefault(v["claim"], {**v, "run": name})
    unreadable = {m.group(1) for m in (re.search(r"(\d\d)[^/]*\.json ", p) for p in own_problems) if m}
    ledger = []
    # which notebooks should have judged each claim (none named where no catalog is at hand:
    # a report of a few notebooks run outside the project's checkout)
    tested_in = catalog.claim_notebooks() if catalog.CATALOG.is_file() else {c: [] for c in CLAIMS}
    for cid, text in CLAIMS.items():
        entries = [{**v, "notebook": r["notebook"], "kind": kind_of(v["verdict"])}
                   for r in results for v in r.get("verdicts", []) if v.get("claim") == cid]
        recorded = {e["notebook"][:2] for e in entries}
        for nb in tested_in[cid]:       # a notebook meant to test it that did not
            if nb not in recorded:
                entries.append({"notebook": f"notebook {nb}", "verdict": NOT_RUN, "kind": NOT_RUN,
                                "figure": "", "detail": "", "synthetic_data": False})
        for e in entries:  # its results file is there but unreadable: say so, not "not run"
            if e["verdict"] == NOT_RUN and e["notebook"][-2:] in unreadable:
                e["verdict"] = "results file unreadable"
        decided = {e["kind"] for e in entries if e["kind"] in DECIDED}
        ledger.append({
            "claim": cid, "text": text, "notebooks": tested_in[cid], "entries": entries,
            "disagree": len(decided) > 1,
            "rule": RULES[cid].threshold, "compares": RULES[cid].compares,
            "reference": ref_verdicts.get(cid),
        })
    counts = Counter(e["kind"] for c in ledger for e in c["entries"])
    return {
        "hardware": results[0]["hardware"] if results else None,
        "notebooks": results,
        "run_log": run_log or {},
        "ledger": ledger,
        "counts": {k: counts[k] for k in (*VERDICT_KINDS, NOT_RUN) if counts[k]},
        "references": references,
        "problems": problems,
    }


def _ref_index(references: list[tuple[str, list[dict[str, Any]]]]) -> dict[tuple[str, str], tuple[str, dict]]:
    idx = {}
    for name, ref in references:
        for r in ref:
            for m in r.get("measurements", []):
                idx.setdefault((r["notebook"], m["name"]), (name, m))
    return idx


def measurements_frame(r: dict[str, Any], ref_idx: dict) -> pd.DataFrame:
    """One notebook's measurements as a table (value, unit, ratio, note, reference run)."""
    rows = []
    for m in r.get("measurements", []):
        ref = ref_idx.get((r["notebook"], m["name"]))
        rows.append({"measurement": m["name"], "value": _fmt(m["value"]), "unit": m["unit"],
                     "ratio": f"{m['ratio']:.2f}x" if m.get("ratio") is not None else "",
                     "note": m.get("note", ""),
                     "reference (GPU)": f"{_fmt(ref[1]['value'])} {ref[1]['unit']} ({ref[0]})" if ref else ""})
    df = pd.DataFrame(rows, columns=["measurement", "value", "unit", "ratio", "note", "reference (GPU)"])
    return df if ref_idx else df.drop(columns="reference (GPU)")


def _verdict_text(e: dict[str, Any]) -> str:
    return e["verdict"] + (" (synthetic data)" if e.get("synthetic_data") else "")


def _waterfall(rep: dict[str, Any]) -> str | None:
    """The capstone's waterfall figure (path relative to the results folder), if it ran."""
    for r in rep["notebooks"]:
        for fig in r.get("figures", []):
            if "waterfall" in fig:
                return fig
    return None


def _executed_html(nb: str, notebooks_dir: Path) -> Path | None:
    p = notebooks_dir / f"{nb}.html"
    return p if p.exists() else None


def _md_inline_to_html(line: str) -> str:
    """**bold** and `code` of the run-state line, escaped (the HTML carries no Markdown)."""
    text = html.escape(line)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def _rel(path: Path, report_dir: Path) -> str:
    return Path(os.path.relpath(path, report_dir)).as_posix()


# ----------------------------------------------------------------------------------- Markdown

def to_markdown(rep: dict[str, Any], results_dir: Path, report_dir: Path | None = None,
                notebooks_dir: Path | None = None) -> str:
    """The plain-text companion of the HTML page; links and figures relative to `report_dir`
    (default: the folder above `results_dir`, where `write` puts report.md)."""
    results_dir = Path(results_dir)
    report_dir = Path(report_dir) if report_dir is not None else results_dir.parent
    notebooks_dir = Path(notebooks_dir) if notebooks_dir is not None else results_dir.parent / "notebooks"
    out = ["# Feed the GPU - results on this machine", ""]
    out += _run_lines(rep["run_log"])
    if rep.get("problems"):
        out += ["## Warning: results files that could not be read", ""]
        out += [f"- {p}" for p in rep["problems"]] + [""]
    if rep["hardware"]:
        out += [f"**Machine:** {_hardware_line(rep['hardware'])}", ""]
    for name, ref in rep["references"]:
        if ref:
            out.append(f"- Reference run `{name}`: {_hardware_line(ref[0]['hardware'])}, "
                       f"profile {ref[0].get('profile')}, {str(ref[0].get('started', ''))[:10]}")
    out += ["", "**Verdicts:** " + ", ".join(f"{k}: {n}" for k, n in rep["counts"].items()), "",
            "## Claims ledger", ""]
    for c in rep["ledger"]:
        flag = " **(notebooks disagree)**" if c["disagree"] else ""
        out.append(f"- **{c['claim']}** {c['text']}{flag}")
        for e in c["entries"]:
            fig = f": {e['figure']}" if e.get("figure") else ""
            out.append(f"  - {e['notebook']}: *{_verdict_text(e)}*{fig}")
        out.append(f"  - rule: {c['compares']}; threshold: {c['rule']}")
        if c["reference"]:
            ref = c["reference"]
            out.append(f"  - reference ({ref['run']}): *{ref['verdict']}*: {ref['figure']}")
    wf = _waterfall(rep)
    if wf:
        out += ["", "## The capstone's waterfall", "", f"![waterfall]({_rel(results_dir / wf, report_dir)})"]
    ref_idx = _ref_index(rep["references"])
    runs = rep["run_log"].get("notebooks", {})
    for r in rep["notebooks"]:
        nb = r["notebook"]
        log = runs.get(nb, {})
        out += ["", f"## {nb}", ""]
        status = f"profile {r.get('profile')}"
        if log:
            status += f", ran in {log.get('seconds', 0):.0f} s, {log.get('status')}"
        executed = _executed_html(nb, notebooks_dir)
        if executed:
            status += f" ([executed notebook]({_rel(executed, report_dir)}))"
        out.append(status)
        for ds, info in r.get("data_sources", {}).items():
            out.append(f"- data: {ds} - {'**SYNTHETIC** stand-in' if info['synthetic'] else 'real'} {info.get('detail', '')}")
        df = measurements_frame(r, ref_idx)
        if len(df):
            out += ["", "```", df.to_string(index=False), "```"]
        for fig in r.get("figures", []):
            out += ["", f"![{Path(fig).stem}]({_rel(results_dir / fig, report_dir)})"]
    failed = [n for n, v in runs.items() if v.get("status") != "ok"]
    if failed:
        out += ["", "## Notebooks that failed", ""] + [f"- {n}: {runs[n].get('error', '')}" for n in failed]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------- HTML

def _colour(kind: str) -> str:
    return COLOURS.get(kind, NEEDS_COLOUR)


def _img(path: Path, alt: str) -> str:
    try:
        data = base64.b64encode(path.read_bytes()).decode()
    except OSError:
        return f"<p>(missing figure {html.escape(path.name)})</p>"
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _ledger_html(rep: dict[str, Any]) -> str:
    with_refs = any(c["reference"] for c in rep["ledger"])
    rows = []
    for c in rep["ledger"]:
        cells = []
        for e in c["entries"]:
            fig = f"<div class='fig'>{html.escape(e['figure'])}</div>" if e.get("figure") else ""
            cells.append(f"<div class='v' style='background:{_colour(e['kind'])}'>"
                         f"<b>{html.escape(e['notebook'])}</b>: {html.escape(_verdict_text(e))}{fig}</div>")
        ref = c["reference"]
        ref_txt = (f"{html.escape(ref['verdict'])}: {html.escape(ref['figure'])} ({html.escape(ref['run'])})"
                   if ref else "")
        flag = "<div class='disagree'>notebooks disagree</div>" if c["disagree"] else ""
        rule = (f"<details><summary>rule</summary><div class='rule'>compares {html.escape(c['compares'])}; "
                f"<i>threshold:</i> {html.escape(c['rule'])}</div></details>")
        rows.append(f"<tr><td><b>{c['claim']}</b></td><td>{html.escape(c['text'])}{flag}{rule}</td>"
                    f"<td>{''.join(cells)}</td>" + (f"<td>{ref_txt}</td>" if with_refs else "") + "</tr>")
    return ("<table class='ledger'><tr><th>claim</th><th>the claim</th><th>verdict per notebook (this machine)</th>"
            + ("<th>reference (GPU)</th>" if with_refs else "") + "</tr>" + "".join(rows) + "</table>")


def to_html(rep: dict[str, Any], results_dir: Path, report_dir: Path | None = None,
            notebooks_dir: Path | None = None) -> str:
    """A self-contained page: figures inlined, tables from pandas, links relative to `report_dir`."""
    results_dir = Path(results_dir)
    report_dir = Path(report_dir) if report_dir is not None else results_dir.parent
    notebooks_dir = Path(notebooks_dir) if notebooks_dir is not None else results_dir.parent / "notebooks"
    e = html.escape
    body = ["<h1>Feed the GPU: results on this machine</h1>"]
    body += [f"<p class='run'>{_md_inline_to_html(line)}</p>" for line in _run_lines(rep["run_log"]) if line]
    if rep.get("problems"):
        body += ["<h2 class='warn'>Warning: results files that could not be read</h2>",
                 "<ul>" + "".join(f"<li>{e(p)}</li>" for p in rep["problems"]) + "</ul>"]
    if rep["hardware"]:
        body.append(f"<p><b>Machine:</b> {e(_hardware_line(rep['hardware']))}</p>")
    refs = [f"<li>Reference run <code>{e(name)}</code>: {e(_hardware_line(ref[0]['hardware']))}, profile "
            f"{e(str(ref[0].get('profile')))}, {e(str(ref[0].get('started', ''))[:10])}</li>"
            for name, ref in rep["references"] if ref]
    if refs:
        body.append("<ul>" + "".join(refs) + "</ul>")
    body.append("<p class='counts'>" + " ".join(
        f"<span style='background:{_colour(k)}'>{e(k)}: <b>{n}</b></span>" for k, n in rep["counts"].items())
        + "</p>")
    body += ["<h2>Claims ledger</h2>", _ledger_html(rep)]
    wf = _waterfall(rep)
    if wf:
        body += ["<h2>The capstone's waterfall</h2>", f"<p>{_img(results_dir / wf, 'waterfall')}</p>"]
    ref_idx = _ref_index(rep["references"])
    runs = rep["run_log"].get("notebooks", {})
    body.append("<h2>Each notebook's measurements</h2>")
    for r in rep["notebooks"]:
        nb = r["notebook"]
        log = runs.get(nb, {})
        body.append(f"<h3 id='{e(nb)}'>{e(nb)}</h3>")
        status = f"profile {r.get('profile')}"
        if log:
            status += f", ran in {log.get('seconds', 0):.0f} s, {log.get('status')}"
        executed = _executed_html(nb, notebooks_dir)
        link = f" - <a href='{e(_rel(executed, report_dir))}'>executed notebook</a>" if executed else ""
        body.append(f"<p>{e(status)}{link}</p>")
        for ds, info in r.get("data_sources", {}).items():
            kind = "<b class='syn'>SYNTHETIC</b> stand-in" if info["synthetic"] else "real"
            body.append(f"<p>data: {e(ds)} - {kind} {e(info.get('detail', ''))}</p>")
        df = measurements_frame(r, ref_idx)
        if len(df):
            body.append(df.to_html(index=False, border=0, classes="m", escape=True))
        figs = "".join(_img(results_dir / f, Path(f).stem) for f in r.get("figures", []))
        if figs:
            body.append(f"<p class='figs'>{figs}</p>")
    failed = [n for n, v in runs.items() if v.get("status") != "ok"]
    if failed:
        body += ["<h2>Notebooks that failed</h2>",
                 "<ul>" + "".join(f"<li>{e(n)}: {e(runs[n].get('error', ''))}</li>" for n in failed) + "</ul>"]
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222;padding:0 1em}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
             "font-size:90%;vertical-align:top;text-align:left}th{background:#eee}"
             ".ledger td:first-child{white-space:nowrap}.ledger td:nth-child(2){width:38%}.v{padding:2px 4px;margin:2px 0;border-radius:3px}"
             ".fig{font-size:85%;color:#444}.rule{font-size:80%;color:#555}summary{font-size:80%;color:#555;cursor:pointer}"
             ".disagree{color:#b00020;font-weight:bold;font-size:85%}"
             ".counts span{padding:3px 8px;margin-right:6px;border-radius:3px;display:inline-block}"
             ".syn{color:#b00020}.warn{color:#b00020}img{max-width:560px;margin:4px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Feed the GPU report</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")


def render_notebooks(notebooks_dir: Path) -> list[Path]:
    """Each executed notebook as a static HTML page next to it (nbconvert's lab template)."""
    import nbformat
    from nbconvert import HTMLExporter

    if not Path(notebooks_dir).is_dir():
        raise FileNotFoundError(f"render_notebooks: notebooks_dir {notebooks_dir} is not a folder of "
                                "executed notebooks")
    exporter = HTMLExporter(template_name="lab")
    out = []
    for nb_path in sorted(Path(notebooks_dir).glob("*.ipynb")):
        target = nb_path.with_suffix(".html")
        if target.exists() and target.stat().st_mtime >= nb_path.stat().st_mtime:
            out.append(target)  # rendered after the run wrote it: the report is rewritten often
            continue
        try:
            body, _ = exporter.from_notebook_node(nbformat.read(nb_path, as_version=4))
        except Exception as err:  # a broken copy must not cost the report
            print(f"report: could not render {nb_path.name} to HTML ({type(err).__name__}: {err})")
            continue
        paths.write_atomic(target, body)
        out.append(target)
    return out


def write(build_dir: Path | None = None, out_dir: Path | None = None) -> Path:
    """Write `report.md` and `report.html` for a run folder (one that holds `results/` and
    `run.json`; default: the newest run, else the build folder) into `out_dir` (default: that
    folder), links and figures relative to `out_dir`; each executed notebook in `notebooks/` is
    rendered to HTML once. Return the HTML path."""
    if build_dir is None:  # the newest run folder of `make run`, else the build folder itself
        build_dir = paths.latest_run() or paths.build_dir()
    build_dir = Path(build_dir)
    if not build_dir.is_dir():
        raise FileNotFoundError(f"report.write: build_dir {build_dir} does not exist; run the notebooks "
                                "first (make run), or pass the folder that holds results/")
    results_dir = build_dir / "results"
    log_path = build_dir / "run.json"
    problems: list[str] = []
    run_log = {}
    if log_path.exists():
        try:
            run_log = json.loads(log_path.read_text())
        except (ValueError, OSError) as e:
            problems.append(f"{log_path} cannot be read ({e}): notebook statuses are missing")
    if (build_dir / "notebooks").is_dir():
        render_notebooks(build_dir / "notebooks")
    rep = build(load_all(results_dir, problems=problems), run_log, problems=problems)
    for p in problems:
        print(f"report: WARNING: {p}", file=sys.stderr)
    out_dir = Path(out_dir) if out_dir is not None else build_dir
    paths.write_atomic(out_dir / "report.md", to_markdown(rep, results_dir, out_dir, build_dir / "notebooks"))
    html_path = out_dir / "report.html"
    paths.write_atomic(html_path, to_html(rep, results_dir, out_dir, notebooks_dir=build_dir / "notebooks"))
    return html_path


if __name__ == "__main__":
    print(write())
