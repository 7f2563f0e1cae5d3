"""No verdict from a measurement too small to decide it: for every rule judged on timed windows,
a window below its device's floor or a ratio whose range over the repeats straddles the rule's
threshold gives "inconclusive", a long window with a tight range the rule's own outcome; and every
notebook passes the timing behind each timed claim it judges. Thresholds come from the rules'
own data (`Rule.limits`), never copied here."""

import ast

import nbformat
import pytest

from helpers import timing
from helpers.suite import catalog, claims
from helpers.suite.claims import RULES, WINDOW_FLOORS, judge
from helpers.suite.results import Recorder
from tests import notebook_sections as ns

# The rules judged on timed windows, pinned: a rule that stops being timed must be changed here.
TIMED = {
    "L1": ("gain", "past_vs_within"),
    "L3": ("copy_gain",),
    "L4": ("in_ram_gain",),
    "L5": ("gain",),
    "L6": ("epoch_ratio", "feed_ratio"),
    "L10": ("round_trip_share",),
    "L11": ("slowdown",),
    "L12": ("speedup",),
    "L13": ("gpu_vs_cpu_time",),
    "L15": ("less_time",),
    "L17": ("handoff_share",),
    "L22": ("code_gain",),
}

# (claim, timed quantity) -> (its threshold from the rule's limits, the other quantities): the
# others are chosen, from the limits too, so that this quantity alone decides the outcome.
PROBES = {
    ("L1", "gain"): (lambda t: t["gain"], lambda t: {"past_vs_within": None}),
    ("L1", "past_vs_within"): (lambda t: t["past"], lambda t: {"gain": 2 * t["gain"]}),
    ("L3", "copy_gain"): (lambda t: t["copy"], lambda t: {}),
    ("L4", "in_ram_gain"): (lambda t: t["gain"], lambda t: {"read_share": 2 * t["read"]}),
    ("L5", "gain"): (lambda t: t["gain"], lambda t: {}),
    ("L6", "epoch_ratio"): (
        lambda t: t["epoch"],
        lambda t: {"on_gpu": True, "decodes_on_device": True, "feed_ratio": 0.5 * t["feed"]},
    ),
    ("L6", "feed_ratio"): (
        lambda t: t["feed"],
        lambda t: {"on_gpu": True, "decodes_on_device": True, "epoch_ratio": 0.5 * t["epoch"]},
    ),
    ("L10", "round_trip_share"): (lambda t: t["share"], lambda t: {"on_gpu": True}),
    ("L11", "slowdown"): (lambda t: t["slower"], lambda t: {"on_gpu": True}),
    ("L12", "speedup"): (
        lambda t: t["speed"],
        lambda t: {"on_gpu": True, "memory_ratio": 2 * t["memory"], "loss_gap": 0.0},
    ),
    ("L13", "gpu_vs_cpu_time"): (lambda t: t["ratio"], lambda t: {"on_gpu": True}),
    ("L15", "less_time"): (lambda t: t["less"], lambda t: {"gpus": 2}),
    ("L17", "handoff_share"): (lambda t: t["handoff"], lambda t: {}),
    # the code gain is compared with the hardware gain over the margin
    ("L22", "code_gain"): (
        lambda t: 4.0 / t["margin"],
        lambda t: {"hardware_gain": 4.0, "cost_ratio": 0.5 * t["cost"]},
    ),
}
LONG = 10 * max(f for f, _ in WINDOW_FLOORS.values())  # well above every floor


def timed_at(value, low, high, window=LONG, device="cpu"):
    return timing.Ratio(value, low, high, ((window, device), (2 * window, device)))


def probe(claim, name, x, t, others=None):
    """`claim` judged with `name` = x (a Ratio or a plain float), the others from PROBES."""
    threshold, make = PROBES[claim, name]
    measured = {**make(RULES[claim].limits), **(others or {}), name: x}
    given = tuple(t if n == name else None for n in RULES[claim].timed)
    return judge(claim, given if t is not None else None, **measured), threshold(
        RULES[claim].limits
    )


def test_the_timed_rules_are_the_pinned_ones():
    assert {c: r.timed for c, r in RULES.items() if r.timed} == TIMED
    assert set(PROBES) == {(c, n) for c, names in TIMED.items() for n in names}
    for c, names in TIMED.items():  # each timed quantity is one the rule compares
        assert all(n in RULES[c].decide.__code__.co_varnames for n in names), c


@pytest.mark.parametrize("key", list(PROBES), ids=lambda k: f"{k[0]}-{k[1]}")
def test_a_window_below_the_floor_is_inconclusive(key):
    claim, name = key
    limit = PROBES[key][0](RULES[claim].limits)
    for device, (least, _) in WINDOW_FLOORS.items():
        for x in (0.5 * limit, 2 * limit):  # tight ranges either side of the threshold
            t = timed_at(x, x, x, window=0.5 * least, device=device)
            verdict, _ = probe(claim, name, t, t)
            assert verdict.startswith("inconclusive: too small to measure here"), (device, x)
            assert f"{least * 1e3:g} ms floor ({device})" in verdict
    # a window whose device is not named gets the largest floor
    worst = max(f for f, _ in WINDOW_FLOORS.values())
    t = timed_at(2 * limit, 2 * limit, 2 * limit, window=0.9 * worst, device=None)
    assert probe(claim, name, t, t)[0].startswith("inconclusive: too small")


@pytest.mark.parametrize("key", list(PROBES), ids=lambda k: f"{k[0]}-{k[1]}")
def test_a_range_across_the_threshold_is_inconclusive(key):
    claim, name = key
    limit = PROBES[key][0](RULES[claim].limits)
    t = timed_at(limit, 0.9 * limit, 1.1 * limit)
    verdict, _ = probe(claim, name, t, t)
    assert verdict.startswith("inconclusive: the repeats range from"), verdict
    assert verdict.endswith("run it again with more steps")
    assert f"{limit:.3g}" in verdict, "the reason names the threshold it straddles"
    assert claims.kind_of(verdict) == "inconclusive"


@pytest.mark.parametrize("key", list(PROBES), ids=lambda k: f"{k[0]}-{k[1]}")
def test_a_long_window_and_a_tight_range_give_the_rules_outcome(key):
    claim, name = key
    limit = PROBES[key][0](RULES[claim].limits)
    outcomes = set()
    for x in (0.5 * limit, 2 * limit):
        t = timed_at(x, 0.99 * x, 1.01 * x)
        verdict, _ = probe(claim, name, t, t)
        assert verdict == probe(claim, name, x, None)[0], (claim, x)  # the rule's, as before
        assert claims.kind_of(verdict) in claims.DECIDED
        outcomes.add(verdict)
    assert len(outcomes) == 2, "either side of the threshold: two outcomes, both decided"


def test_an_outcome_no_timing_decides_is_kept():
    """ "needs a GPU" stays, however short the window: no measured ratio decided it."""
    t = timed_at(1.0, 0.5, 3.0, window=1e-6)
    assert judge("L11", t, on_gpu=False, slowdown=t) == claims.GPU
    assert judge("L10", None, on_gpu=False, round_trip_share=None) == claims.GPU


def test_a_timing_that_does_not_match_is_refused():
    t = timed_at(1.5, 1.4, 1.6)
    with pytest.raises(ValueError, match="gain = 3.0 is not in its timing's range"):
        judge("L5", t, gain=3.0)
    with pytest.raises(TypeError, match="not judged on timed windows"):
        judge("L2", t, added_vs_arithmetic=1.0, added_growth_mb=1.0)
    with pytest.raises(TypeError, match="got 2 timing"):
        judge("L5", (t, t), gain=t)


def test_a_threshold_computed_from_the_measurements_is_named():
    """L22 compares the code gain with the hardware gain: the reason gives where it flips."""
    t = timed_at(3.0, 2.7, 3.3)
    verdict = judge("L22", t, code_gain=t, hardware_gain=3.0 * RULES["L22"].limits["margin"])
    assert verdict.startswith("inconclusive: the repeats range from 2.7 to 3.3 (code_gain)")
    assert "threshold (3 here, from the other measurements)" in verdict


def test_measured_timings_carry_their_windows_and_range():
    """A real timing: a ratio from two benchmarks, judged through the recorder."""
    a = timing.measurement([0.30, 0.33, 0.31], "a", device="cpu")
    b = timing.measurement([0.10, 0.11, 0.10], "b", device="cpu")
    r = timing.ratio(a, b)
    assert judge("L5", r, gain=r) == claims.HOLDS  # 2.7x to 3.3x, all above 1.5x
    tiny = timing.ratio(timing.measurement([0.003, 0.0031]), b)
    assert judge("L5", tiny, gain=tiny).startswith("inconclusive: too small")


def test_the_recorder_prints_records_and_counts_inconclusive(tmp_path, capsys):
    record = Recorder("02_data_loading", directory=tmp_path)
    r = timed_at(1.15, 1.0, 1.3)
    v = record.judge("L5", figure="1.15x", gain=r, timing=r)
    assert v.startswith("inconclusive: the repeats range from 1 to 1.3 (gain)")
    out = capsys.readouterr().out
    assert out.startswith("[not decided here] L5 - inconclusive: the repeats range")
    assert "rule: holds when" in out and "timed: gain from 1 to 1.3" in out
    entry = record.data["verdicts"][-1]
    assert entry["timing"]["gain"]["window_s"] == LONG and entry["timing"]["gain"]["low"] == 1.0
    assert claims.kind_of(entry["verdict"]) == "inconclusive"
    from helpers.suite import report, results

    counts = report.build(results.load_all(tmp_path), references=[])["counts"]
    assert counts.get("inconclusive") == 1 and not counts.get(claims.HOLDS)


def _code(nb) -> dict[int, ast.Module]:
    """The notebook's code cells as Python by cell index (magics and shell lines left out)."""
    out = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or cell.source.lstrip().startswith("%%"):
            continue
        out[i] = ast.parse(ns.python_source(cell.source))
    return out


def untimed_judges(cells: dict[int, ast.Module]) -> list[str]:
    """The `.judge("L..", ...)` calls of a timed claim without `timing=`; a call whose timed
    quantities are all the literal None measured nothing to time and needs none."""
    missing = []
    for i, tree in cells.items():
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            if getattr(call.func, "attr", None) != "judge" or not call.args:
                continue
            claim = getattr(call.args[0], "value", None)
            if claim not in TIMED:
                continue
            kw = {k.arg: k.value for k in call.keywords}
            nothing = all(
                isinstance(kw.get(n), ast.Constant) and kw[n].value is None for n in TIMED[claim]
            )
            given = kw.get("timing")
            if not nothing and (given is None or isinstance(given, ast.Constant)):
                missing.append(f"{claim} in cell {i}")
    return missing


def test_the_check_finds_a_judge_without_timing():
    cells = [
        'record.judge("L5", gain=g, figure="x")',
        'record.judge("L5", gain=g, timing=None, figure="x")',
        'record.judge("L5", gain=g, timing=g, figure="x")',
        'record.judge("L10", on_gpu=False, round_trip_share=None, figure="x")',
        'record.judge("L2", added_vs_arithmetic=1, added_growth_mb=1, figure="x")',
    ]
    found = untimed_judges({i: ast.parse(c) for i, c in enumerate(cells)})
    assert found == ["L5 in cell 0", "L5 in cell 1"]


@pytest.mark.parametrize("entry", catalog.load(), ids=lambda e: e["file"])
def test_every_timed_verdict_in_the_notebooks_passes_its_timing(entry):
    nb = nbformat.read(catalog.CATALOG.parent / entry["file"], as_version=4)
    assert untimed_judges(_code(nb)) == []
