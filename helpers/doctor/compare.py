"""`python -m helpers.doctor compare BEFORE.json AFTER.json`: did the change help?

Two `--json` reports of the same loop, before and after a change: the step-time change with
its noise band, the findings that appeared or went away, and the shares that moved. A change
inside the band is "no measurable change": two runs of the same script differ by that much.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Two runs of the same unchanged script differ by this much in their median step on a shared
# machine (the suite's benchmarks re-run a loop a few times; a neighbour's burst, the CPU's
# clock and where the OS places threads move a step by up to ~10 %): no change below it is
# told from the noise, however steady each run's own steps were.
NOISE_FLOOR = 0.10
# A share that moved by less than this is not reported as moved: the smallest share a rule
# fires on (the 5 % data wait and sync stall rules).
SHARE_MOVE = 0.05


class ReportError(ValueError):
    """A file that is not a doctor's diagnosis (an error report, another file)."""


def load(path: str | Path) -> dict:
    """A `--json` report with a diagnosis in it."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ReportError(f"{path}: not a readable JSON report ({e})") from e
    if not isinstance(report, dict) or "measured" not in report:
        why = report.get("error", "no 'measured' key") if isinstance(report, dict) else "not one"
        raise ReportError(f"{path}: no diagnosis to compare ({why})")
    return report


def band(before: dict, after: dict) -> tuple[float, str]:
    """(the relative noise band, how it was set): the larger of each report's step spread
    (interquartile range over the median step) and NOISE_FLOOR."""
    spreads = []
    for r in (before, after):
        m = r["measured"]
        s = m.get("step_spread_s")
        spreads.append(s / m["step_s"] if s is not None and m["step_s"] > 0 else None)
    seen = [s for s in spreads if s is not None]
    width = max([NOISE_FLOOR, *seen])
    words = ", ".join("n/a" if s is None else f"{100 * s:.0f} %" for s in spreads)
    return width, (
        f"the larger of the two reports' step spreads ({words}, interquartile range over the "
        f"median) and a {100 * NOISE_FLOOR:.0f} % run-to-run noise floor"
    )


def _shares(report: dict) -> dict[str, float | None]:
    return {f["kind"]: f.get("share") for f in report.get("findings", [])}


def compare(before: dict, after: dict) -> dict:
    """The comparison as data: step change, band, findings appeared and gone, shares moved."""
    b, a = before["measured"]["step_s"], after["measured"]["step_s"]
    change = a / b - 1 if b > 0 else 0.0
    width, how = band(before, after)
    sb, sa = _shares(before), _shares(after)
    moved = {
        k: (sb[k], sa[k])
        for k in sb
        if k in sa and sb[k] is not None and sa[k] is not None and abs(sa[k] - sb[k]) >= SHARE_MOVE
    }
    return {
        "step_s_before": b,
        "step_s_after": a,
        "change": change,
        "band": width,
        "band_from": how,
        "measurable": abs(change) > width,
        "appeared": [k for k in sa if k not in sb],
        "gone": [k for k in sb if k not in sa],
        "moved": moved,
        "notes": _notes(before, after),
    }


def _notes(before: dict, after: dict) -> list[str]:
    """What makes the two step times not the same work: said, not corrected for."""
    notes = []
    mb, ma = before["measured"], after["measured"]
    for key, what in (("device", "devices"), ("batch_size", "batch sizes")):
        if mb.get(key) != ma.get(key):
            notes.append(
                f"different {what} ({mb.get(key)} -> {ma.get(key)}): a step is not the same "
                "work; compare samples/s"
            )
    for name, r in (("before", before), ("after", after)):
        if r.get("inconclusive"):
            notes.append(f"the {name} report is inconclusive: a window did not fill")
    return notes


def render(c: dict, before: str = "before", after: str = "after") -> str:
    b, a, ch = c["step_s_before"], c["step_s_after"], c["change"]
    head = f"Compare {before} -> {after}: step {1e3 * b:.2f} ms -> {1e3 * a:.2f} ms (median)"
    if not c["measurable"]:
        verdict = f"no measurable change ({100 * ch:+.0f} %, inside the band)"
    else:
        verdict = f"{b / a:.2f}x faster" if a < b else f"{a / b:.2f}x slower"
        verdict += f" ({100 * ch:+.0f} % step time)"
    lines = [
        head,
        f"  {verdict}; noise band +-{100 * c['band']:.0f} %: {c['band_from']}",
        "  findings appeared: " + (", ".join(c["appeared"]) or "none"),
        "  findings gone: " + (", ".join(c["gone"]) or "none"),
    ]
    if c["moved"]:
        lines.append(
            "  shares moved: "
            + ", ".join(
                f"{k} {100 * x:.0f} % -> {100 * y:.0f} %" for k, (x, y) in c["moved"].items()
            )
        )
    else:
        lines.append(f"  shares moved: none by {100 * SHARE_MOVE:.0f} points or more")
    lines += [f"  note: {n}" for n in c["notes"]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """`compare BEFORE.json AFTER.json`: 0 with the comparison printed, 2 when a file is not a
    report with a diagnosis."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m helpers.doctor compare", description=__doc__.split("\n\n")[1]
    )
    p.add_argument("before", help="a report of `python -m helpers.doctor --json` before a change")
    p.add_argument("after", help="a report of the same loop after the change")
    a = p.parse_args(argv)
    try:
        before, after = load(a.before), load(a.after)
    except ReportError as e:
        print(f"doctor compare: {e}", file=sys.stderr)
        return 2
    print(render(compare(before, after), Path(a.before).name, Path(a.after).name))
    return 0
