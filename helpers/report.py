"""Turn recorded results into a report: Markdown, and a self-contained HTML page with the plots.

Sections: the machine, each notebook's measurements (value, unit, ratio), the whole claims
ledger with this machine's verdicts, and, beside them, reference results committed from GPU runs.
"""

from __future__ import annotations

import base64
import html
import json
import re
import sys
from pathlib import Path
from typing import Any

from . import paths
from .claims import CLAIMS
from .results import load_all


def _fmt(v: float) -> str:
    if not isinstance(v, (int, float)):
        return str(v)
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
    verdicts = {v["claim"]: {**v, "notebook": r["notebook"]} for r in results for v in r.get("verdicts", [])}
    ref_verdicts: dict[str, dict[str, Any]] = {}
    for name, ref in references:
        for r in ref:
            for v in r.get("verdicts", []):
                ref_verdicts.setdefault(v["claim"], {**v, "run": name})
    unreadable = {m.group(1) for m in (re.search(r"(\d\d)[^/]*\.json ", p) for p in own_problems) if m}
    ledger = []
    for cid, (text, where) in CLAIMS.items():
        v = verdicts.get(cid)
        lost = not v and any(w.strip() in unreadable for w in where.split(","))
        ledger.append({
            "claim": cid, "text": text, "where": where,
            # the notebook that recorded the verdict here, else the one(s) meant to test it
            "notebook": v["notebook"] if v else f"notebook {where}",
            "verdict": v["verdict"] if v else ("results file unreadable" if lost else "not tested yet"),
            "figure": v["figure"] if v else "",
            "synthetic_data": v.get("synthetic_data", False) if v else False,
            "reference": ref_verdicts.get(cid),
        })
    return {
        "hardware": results[0]["hardware"] if results else None,
        "notebooks": results,
        "run_log": run_log or {},
        "ledger": ledger,
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


def to_markdown(rep: dict[str, Any], results_dir: Path) -> str:
    out = ["# Feed the GPU - results on this machine", ""]
    out += _run_lines(rep["run_log"])
    if rep.get("problems"):
        out += ["## Warning: results files that could not be read", ""]
        out += [f"- {p}" for p in rep["problems"]] + [""]
    if rep["hardware"]:
        out += [f"**Machine:** {_hardware_line(rep['hardware'])}", ""]
    for name, ref in rep["references"]:
        if ref:
            out.append(f"**Reference run `{name}`:** {_hardware_line(ref[0]['hardware'])}, "
                       f"profile {ref[0].get('profile')}, {str(ref[0].get('started', ''))[:10]}")
    out += ["", "## Claims ledger", "", "| claim | notebook | verdict here | figure | reference (GPU) |",
            "|---|---|---|---|---|"]
    for c in rep["ledger"]:
        syn = " *(synthetic data)*" if c["synthetic_data"] else ""
        ref = c["reference"]
        ref_txt = f"{ref['verdict']}: {ref['figure']} ({ref['run']})" if ref else ""
        out.append(f"| {c['claim']} {_cell(c['text'])} | {_cell(c['notebook'])} | {_cell(c['verdict'])}{syn} | "
                   f"{_cell(c['figure'])} | {_cell(ref_txt)} |")
    ref_idx = _ref_index(rep["references"])
    runs = rep["run_log"].get("notebooks", {})
    for r in rep["notebooks"]:
        nb = r["notebook"]
        log = runs.get(nb, {})
        out += ["", f"## {nb}", ""]
        status = f"profile {r.get('profile')}"
        if log:
            status += f", ran in {log.get('seconds', 0):.0f} s, {log.get('status')}"
        out.append(status)
        for ds, info in r.get("data_sources", {}).items():
            out.append(f"- data: {ds} - {'**SYNTHETIC** stand-in' if info['synthetic'] else 'real'} {info.get('detail', '')}")
        if r.get("measurements"):
            out += ["", "| measurement | value | unit | ratio | note | reference (GPU) |", "|---|---|---|---|---|---|"]
            for m in r["measurements"]:
                ratio = f"{m['ratio']:.2f}x" if m.get("ratio") is not None else ""
                ref = ref_idx.get((nb, m["name"]))
                ref_txt = f"{_fmt(ref[1]['value'])} {ref[1]['unit']} ({ref[0]})" if ref else ""
                out.append(f"| {_cell(m['name'])} | {_fmt(m['value'])} | {_cell(m['unit'])} | {ratio} | "
                           f"{_cell(m.get('note', ''))} | {_cell(ref_txt)} |")
        for fig in r.get("figures", []):
            out += ["", f"![{fig}]({(results_dir / fig).as_posix()})"]
    failed = [n for n, v in runs.items() if v.get("status") in ("failed", "interrupted")]
    if failed:
        out += ["", "## Notebooks that failed", ""] + [f"- {n}: {runs[n].get('error', '')}" for n in failed]
    return "\n".join(out) + "\n"


def to_html(markdown_text: str, results_dir: Path) -> str:
    """A small Markdown-to-HTML pass (tables, headings, lists, images inlined as base64)."""
    body, in_table = [], False
    for line in markdown_text.splitlines():
        if line.startswith("|"):
            cells = [html.escape(c.strip().replace("\\|", "|"))
                     for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
            if set("".join(cells)) <= set("-: "):
                continue
            if not in_table:
                body.append("<table>")
                in_table = True
                body.append("<tr>" + "".join(f"<th>{c}</th>" for c in cells) + "</tr>")
            else:
                body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        if line.startswith("!["):
            src = line[line.index("(") + 1:-1]
            try:
                data = base64.b64encode(Path(src).read_bytes()).decode()
                body.append(f'<p><img alt="plot" src="data:image/png;base64,{data}"></p>')
            except OSError:
                body.append(f"<p>(missing figure {html.escape(src)})</p>")
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{html.escape(line[level:].strip())}</h{level}>")
        elif line.startswith("- "):
            body.append(f"<li>{html.escape(line[2:])}</li>")
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    if in_table:
        body.append("</table>")
    text = "\n".join(body).replace("**", "")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
             "font-size:90%;vertical-align:top}th{background:#eee}img{max-width:700px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Feed the GPU report</title>"
            f"<style>{style}</style></head><body>{text}</body></html>")


def write(build_dir: Path | None = None) -> Path:
    """Write `report.md` and `report.html` into a run folder (one that holds `results/` and
    `run.json`; default: the newest run, else the build folder); return the HTML path."""
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
    rep = build(load_all(results_dir, problems=problems), run_log, problems=problems)
    for p in problems:
        print(f"report: WARNING: {p}", file=sys.stderr)
    md = to_markdown(rep, results_dir)
    paths.write_atomic(build_dir / "report.md", md)
    html_path = build_dir / "report.html"
    paths.write_atomic(html_path, to_html(md, results_dir))
    return html_path


if __name__ == "__main__":
    print(write())
