"""Every claim's rule: its thresholds pinned here (moving one fails a test), probed just either side
of each, every outcome reached, and its kind (verdict or mechanism) consistent with its outcomes."""

import ast
import re

import nbformat
import pytest

from helpers.suite import catalog, claims
from helpers.suite.claims import (
    GPU,
    GPUS2,
    HOLDS,
    NOT_HERE,
    NOT_SHOWN,
    REAL_DATA,
    RULES,
    SHOWN,
    Rule,
    judge,
)
from tests import notebook_sections as ns

# Each rule's thresholds, pinned: a changed number must be changed here too, on purpose.
LIMITS = {
    "L1": {"gain": 1.1, "past": 1.1},
    "L2": {"low": 0.5, "high": 2, "spread": 1},
    "L3": {"copy": 2, "some": 1.1},
    "L4": {"gain": 1.2, "read": 0.25},
    "L5": {"gain": 1.5, "some": 1.1},
    "L6": {"epoch": 10, "feed": 10},
    "L7": {"drop": 0.01, "spread": 2},
    "L8": {"equal": 1e-4, "differs": 1e-3},
    "L9": {"kept": 10},
    "L10": {"share": 0.1},
    "L11": {"slower": 1.1},
    "L12": {"speed": 1.2, "memory": 1.3, "loss": 0.05},
    "L13": {"ratio": 0.9},
    "L14": {"imbalance": 1.1},
    "L15": {"less": 0.1},
    "L16": {},
    "L17": {"handoff": 0.02},
    "L18": {"equal": 1e-4, "differs": 1e-6},
    "L19": {},
    "L20": {"slower": 5},
    "L21": {},
    "L22": {"margin": 1, "cost": 1},
    "L23": {"drop": 0.02},
}

CORES, LOWER = "holds only when workers <= usable cores", "holds only when read as a lower bound"
COPY = "holds only when the copy is large enough to be bandwidth-bound"
READ, PRE = (
    "holds only when reading, not the CPU, is the slow step",
    "holds only when the preprocessing is a large part of the epoch",
)
STEP, BOUND = (
    "holds only when the training step is fast next to the CPU pipeline",
    "holds only when the model is large enough to be compute-bound",
)
DEARER = "holds only when the time saved is worth the money"
LR, BN = "holds (learning-rate part)", "mechanism shown (batch-norm part)"

# claim -> [(threshold, measurements made from the probed value x, outcome just below,
#            outcome just above)]
EDGES = {
    "L1": [
        ("gain", lambda x: {"gain": x, "past_vs_within": None}, NOT_HERE, CORES),
        ("past", lambda x: {"gain": 2.0, "past_vs_within": x}, CORES, HOLDS),
    ],
    "L2": [
        ("low", lambda x: {"added_vs_arithmetic": x, "added_growth_mb": 20}, NOT_HERE, HOLDS),
        ("high", lambda x: {"added_vs_arithmetic": x, "added_growth_mb": 20}, HOLDS, LOWER),
        (  # growth must pass the added memory's spread: 10 MB of spread, growth 10 MB x spread
            "spread",
            lambda x: {
                "added_vs_arithmetic": 6.0,
                "added_growth_mb": 10 * x,
                "added_spread_mb": 10,
            },
            NOT_HERE,
            LOWER,
        ),
    ],
    "L3": [
        ("copy", lambda x: {"copy_gain": x}, COPY, HOLDS),
        ("some", lambda x: {"copy_gain": x}, NOT_HERE, COPY),
    ],
    "L4": [
        ("gain", lambda x: {"in_ram_gain": x, "read_share": 0.6}, NOT_HERE, HOLDS),
        ("read", lambda x: {"in_ram_gain": 1.0, "read_share": x}, READ, NOT_HERE),
    ],
    "L5": [
        ("gain", lambda x: {"gain": x}, PRE, HOLDS),
        ("some", lambda x: {"gain": x}, NOT_HERE, PRE),
    ],
    "L6": [
        (
            "epoch",
            lambda x: {
                "on_gpu": True,
                "decodes_on_device": True,
                "epoch_ratio": x,
                "feed_ratio": 50,
            },
            STEP,
            HOLDS,
        ),
        (
            "feed",
            lambda x: {
                "on_gpu": True,
                "decodes_on_device": True,
                "epoch_ratio": 3,
                "feed_ratio": x,
            },
            NOT_HERE,
            STEP,
        ),
    ],
    "L7": [
        (
            "drop",
            lambda x: {"synthetic": False, "worst_mean_drop": x, "seed_spread": 0.0},
            NOT_HERE,
            HOLDS,
        ),
        (
            "spread",
            lambda x: {"synthetic": False, "worst_mean_drop": 0.05, "seed_spread": 0.05 / x},
            NOT_HERE,
            HOLDS,
        ),
    ],
    "L8": [
        ("equal", lambda x: {"diff_mlp": x, "diff_gn": 1e-7, "diff_bn": 0.05}, SHOWN, NOT_SHOWN),
        ("equal", lambda x: {"diff_mlp": 1e-7, "diff_gn": x, "diff_bn": 0.05}, SHOWN, NOT_SHOWN),
        ("differs", lambda x: {"diff_mlp": 1e-7, "diff_gn": 1e-7, "diff_bn": x}, NOT_SHOWN, SHOWN),
    ],
    "L9": [
        (
            "kept",
            lambda x: {"graph_bytes": 1000 * x, "after_backward_bytes": 1000},
            NOT_SHOWN,
            SHOWN,
        )
    ],
    "L10": [("share", lambda x: {"on_gpu": True, "round_trip_share": x}, NOT_HERE, HOLDS)],
    "L11": [("slower", lambda x: {"on_gpu": True, "slowdown": x}, NOT_HERE, HOLDS)],
    "L12": [
        (
            "speed",
            lambda x: {"on_gpu": True, "speedup": x, "memory_ratio": 1.8, "loss_gap": 0.01},
            BOUND,
            HOLDS,
        ),
        (
            "memory",
            lambda x: {"on_gpu": True, "speedup": 2.0, "memory_ratio": x, "loss_gap": 0.01},
            NOT_HERE,
            HOLDS,
        ),
        (
            "loss",
            lambda x: {"on_gpu": True, "speedup": 2.0, "memory_ratio": 1.8, "loss_gap": x},
            HOLDS,
            NOT_HERE,
        ),
    ],
    "L13": [("ratio", lambda x: {"on_gpu": True, "gpu_vs_cpu_time": x}, NOT_HERE, HOLDS)],
    "L14": [
        (
            "imbalance",
            lambda x: {"gpus": 2, "imbalance_outside": x, "imbalance_inside": 1.0},
            NOT_SHOWN,
            SHOWN,
        )
    ],
    "L15": [("less", lambda x: {"gpus": 2, "less_time": x}, NOT_HERE, HOLDS)],
    "L17": [("handoff", lambda x: {"handoff_share": x}, NOT_HERE, HOLDS)],
    "L18": [
        ("equal", lambda x: {"ddp_vs_global": x, "bn_spread": 1e-3}, BN, NOT_SHOWN),
        ("differs", lambda x: {"ddp_vs_global": 1e-7, "bn_spread": x}, NOT_SHOWN, BN),
    ],
    "L20": [("slower", lambda x: {"ratio": x}, NOT_SHOWN, SHOWN)],
    "L22": [
        ("margin", lambda x: {"code_gain": 3.0, "hardware_gain": 3.0 * x}, NOT_HERE, HOLDS),
        (
            "cost",
            lambda x: {"code_gain": 1.0, "hardware_gain": 3.0, "cost_ratio": x},
            HOLDS,
            DEARER,
        ),
    ],
    "L23": [("drop", lambda x: {"gpus": 2, "acc_one": 0.9, "acc_two": 0.9 - x}, NOT_HERE, HOLDS)],
}

# Outcomes decided by no number: a missing device or data set, a fact, a comparison of two
# measurements.
CASES: dict[str, list[tuple[dict, str]]] = {
    "L3": [({"copy_gain": None}, GPU)],
    "L6": [
        ({"on_gpu": False, "decodes_on_device": True, "epoch_ratio": 20, "feed_ratio": 50}, GPU),
        (
            {"on_gpu": True, "decodes_on_device": False, "epoch_ratio": 20, "feed_ratio": 50},
            claims.DECODER,
        ),
    ],
    "L7": [({"synthetic": True, "worst_mean_drop": 0.1, "seed_spread": 0.0}, REAL_DATA)],
    "L10": [({"on_gpu": False, "round_trip_share": None}, GPU)],
    "L11": [({"on_gpu": False, "slowdown": 1.0}, GPU)],
    "L12": [({"on_gpu": False, "speedup": 1.0, "memory_ratio": 1.0, "loss_gap": 0.0}, GPU)],
    "L13": [({"on_gpu": False, "gpu_vs_cpu_time": None}, GPU)],
    "L14": [
        ({"gpus": 1, "imbalance_outside": None, "imbalance_inside": None}, GPUS2),
        ({"gpus": 2, "imbalance_outside": 1.5, "imbalance_inside": 1.6}, NOT_SHOWN),
    ],
    "L15": [({"gpus": 0, "less_time": None}, GPUS2)],
    "L16": [({"prefix_load_failed": True}, SHOWN), ({"prefix_load_failed": False}, NOT_SHOWN)],
    "L18": [
        ({"lr_losses": (0.5, 1.2, 0.6)}, LR),
        ({"lr_losses": (0.5, 1.2, 1.3)}, NOT_HERE),
        ({"lr_losses": (0.5, 0.6, 0.3)}, NOT_HERE),
    ],
    "L19": [
        ({"odd_world_finished": True, "even_world_finished": True}, SHOWN),
        ({"odd_world_finished": False, "even_world_finished": True}, NOT_SHOWN),
        ({"odd_world_finished": True, "even_world_finished": False}, NOT_SHOWN),
    ],
    "L21": [
        *(
            (
                {
                    "data_loop_kind": "input-bound",
                    "compute_loop_kind": kind,
                    "compute_kinds_expected": claims.DEVICE_KINDS,
                },
                f"{SHOWN}: the device-bound loop read {kind}",
            )
            for kind in claims.DEVICE_KINDS
        ),
        (
            {
                "data_loop_kind": "input-bound",
                "compute_loop_kind": "overhead-bound",
                "compute_kinds_expected": ("device-bound",),
            },
            NOT_SHOWN,
        ),
        (
            {
                "data_loop_kind": "device-bound",
                "compute_loop_kind": "device-bound",
                "compute_kinds_expected": ("device-bound",),
            },
            NOT_SHOWN,
        ),
    ],
    "L22": [({"code_gain": 3.0, "hardware_gain": None}, claims.REFERENCE)],
    "L23": [({"gpus": 1, "acc_one": 0.9, "acc_two": None}, GPUS2)],
}


def either_side(v: float) -> tuple[float, float]:
    eps = abs(v) * 1e-6 or 1e-9
    return v - eps, v + eps


def test_every_claim_has_a_rule_and_pinned_thresholds():
    assert set(RULES) == set(claims.CLAIMS) == set(LIMITS)
    assert {c: r.limits for c, r in RULES.items()} == LIMITS


@pytest.mark.parametrize("claim", list(claims.CLAIMS))
def test_rule_changes_outcome_just_either_side_of_each_threshold(claim):
    r, reached = RULES[claim], set()
    assert {name for name, *_ in EDGES.get(claim, [])} == set(r.limits), "every threshold probed"
    for name, make, below, above in EDGES.get(claim, []):
        lo, hi = either_side(LIMITS[claim][name])
        assert (judge(claim, **make(lo)), judge(claim, **make(hi))) == (below, above), (claim, name)
        reached |= {below, above}
    for measured, expected in CASES.get(claim, []):
        assert judge(claim, **measured) == expected, (claim, measured)
        reached.add(expected)
    assert reached == set(r.verdicts), (
        f"{claim}: outcomes never reached: {set(r.verdicts) - reached}"
    )
    assert len(r.verdicts) >= 2 and r.compares


@pytest.mark.parametrize("claim", list(claims.CLAIMS))
def test_rule_declares_its_kind_and_prints_every_threshold(claim):
    r = RULES[claim]
    mechanism = {v for v in r.verdicts if claims.kind_of(v).startswith("mechanism")}
    measured = {v for v in r.verdicts if not v.startswith(("mechanism", "needs"))}
    assert all(claims.kind_of(v) for v in r.verdicts)
    assert (
        r.kind
        == {(True, False): "mechanism", (False, True): "verdict", (True, True): "both"}[
            bool(mechanism), bool(measured)
        ]
    )
    assert all(f"{{{name}" in r.text for name in r.limits), (
        "the plain-words rule names each threshold"
    )
    assert "{" not in r.threshold


def test_a_rule_with_one_outcome_fails_the_check(monkeypatch):
    const = Rule(
        "L16", "mechanism", "nothing", "none", {}, (SHOWN,), lambda t, prefix_load_failed: SHOWN
    )
    monkeypatch.setitem(RULES, "L16", const)
    with pytest.raises(AssertionError):
        test_rule_changes_outcome_just_either_side_of_each_threshold("L16")


def test_a_moved_threshold_fails_a_test(monkeypatch):
    """L10's share moved in the rule's code (not its data): the cases either side catch it."""
    moved = Rule(
        "L10",
        "verdict",
        "x",
        "y",
        dict(RULES["L10"].limits),
        RULES["L10"].verdicts,
        lambda t, on_gpu, round_trip_share: (
            HOLDS if round_trip_share >= 3 * t["share"] else NOT_HERE
        ),
    )
    monkeypatch.setitem(RULES, "L10", moved)
    with pytest.raises(AssertionError):
        test_rule_changes_outcome_just_either_side_of_each_threshold("L10")


def test_judge_names_the_quantities_on_bad_input():
    with pytest.raises(TypeError, match="the rule compares .*DataParallel state_dict"):
        judge("L16", wrong=1)
    with pytest.raises(ValueError, match="unknown claim 'L99'"):
        judge("L99")


def test_every_claim_is_tested_by_a_notebook_of_the_catalog():
    """The catalog is the one place that maps claims to notebooks; no claim may be left out."""
    tested_in = catalog.claim_notebooks()
    assert set(tested_in) == set(claims.CLAIMS)
    assert [cid for cid, nbs in tested_in.items() if not nbs] == []
    assert tested_in["L4"] == ["02"]  # once: 05 only sizes the read, from a share


def test_the_catalog_refuses_a_claim_the_ledger_does_not_know(tmp_path):
    toml = tmp_path / "catalog.toml"
    toml.write_text(
        '[[notebook]]\nfile = "01_x.ipynb"\ntitle = "x"\nneeds = "cpu"\nclaims = ["L3", "L99"]\n'
    )
    with pytest.raises(ValueError, match=r"'01_x.ipynb' lists unknown claim\(s\) \['L99'\]"):
        catalog.load(toml)


@pytest.mark.parametrize("entry", catalog.load(), ids=lambda e: e["file"])
def test_each_notebook_judges_exactly_the_claims_the_catalog_lists(entry):
    """The catalog's claim list of a notebook is the claims its code judges
    (`record.judge("L..."`)."""
    nb = nbformat.read(catalog.CATALOG.parent / entry["file"], as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert set(re.findall(r"\.judge\(\s*[\"'](L\d+)[\"']", code)) == set(entry.get("claims", []))


def _echoed_verdicts(sources: list[str]) -> list[int]:
    """Cells whose last statement is a `.judge(...)` call with no `;`: IPython shows the returned
    verdict again as an Out line under the verdict the call printed with its rule."""
    found = []
    for i, source in enumerate(sources):
        if source.lstrip().startswith("%%"):
            continue  # a cell magic's body (a file it writes) is not run as Python
        body = ast.parse(ns.python_source(source)).body
        last = body[-1] if body else None
        if (
            isinstance(last, ast.Expr)
            and isinstance(last.value, ast.Call)
            and getattr(last.value.func, "attr", None) == "judge"
            and not source.rstrip().endswith(";")
        ):
            found.append(i)
    return found


def test_a_verdict_cell_shows_its_verdict_once():
    assert _echoed_verdicts(['x = 1\nrecord.judge("L3", figure="2x")', 'record.judge("L3");']) == [
        0
    ]
    for entry in catalog.load():
        nb = nbformat.read(catalog.CATALOG.parent / entry["file"], as_version=4)
        sources = [c.source for c in nb.cells if c.cell_type == "code"]
        assert not _echoed_verdicts(sources), f"{entry['file']}: cells {_echoed_verdicts(sources)}"


def test_a_second_rule_for_one_claim_raises():
    """Two rules under one id would keep the first in silence."""
    first = claims.RULES["L1"]
    with pytest.raises(ValueError, match="claim 'L1' already has a rule"):
        claims.rule("L1", "verdict", "a", "b", {}, ("holds",))(lambda limits: "holds")
    assert claims.RULES["L1"] is first


@pytest.mark.parametrize("claim", list(claims.CLAIMS))
def test_every_rule_says_what_would_turn_it_the_other_way(claim):
    """No verdict looks fixed: each rule names, in one line, what would flip it (or, for a
    mechanism, why nothing on real hardware would)."""
    r = RULES[claim]
    assert r.flips and "{" not in r.other_way and "\n" not in r.other_way
    if r.kind == "mechanism":
        assert r.other_way.startswith("none"), claim


def test_a_mechanism_is_never_scored():
    """A mechanism's outcomes never count as a verdict, whatever it measured."""
    for r in RULES.values():
        if r.kind == "mechanism":
            assert not {claims.kind_of(v) for v in r.verdicts} & set(claims.DECIDED), r.claim


def test_the_recorder_prints_the_other_way_under_each_verdict(tmp_path, capsys):
    from helpers.suite.results import Recorder

    record = Recorder("x", directory=tmp_path)
    record.judge("L5", figure="2x", gain=2.0)
    out = capsys.readouterr().out
    assert f"the other way: {RULES['L5'].other_way}" in out
