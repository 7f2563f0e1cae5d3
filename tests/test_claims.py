"""Every claim's rule reaches each of its verdicts from measurements on both sides of its
thresholds, and no rule can give only one verdict."""

import re

import nbformat
import pytest

from helpers.suite import catalog, claims
from helpers.suite.claims import GPU, GPUS2, HOLDS, NOT_HERE, REAL_DATA, RULES, Rule, judge

# claim -> [(measurements, expected verdict)], values chosen just either side of each threshold
CASES: dict[str, list[tuple[dict, str]]] = {
    "L1": [({"gain": 1.05, "past_vs_within": None}, NOT_HERE),
           ({"gain": 1.8, "past_vs_within": 1.2}, HOLDS),
           ({"gain": 1.8, "past_vs_within": 0.9}, "holds only when workers <= usable cores"),
           ({"gain": 1.8, "past_vs_within": None}, "holds only when workers <= usable cores")],
    "L2": [({"added_vs_arithmetic": 1.4, "added_growth_mb": 20}, HOLDS),
           ({"added_vs_arithmetic": 6.0, "added_growth_mb": 20}, "holds only when read as a lower bound"),
           ({"added_vs_arithmetic": 6.0, "added_growth_mb": -1}, NOT_HERE),
           ({"added_vs_arithmetic": 0.3, "added_growth_mb": 5}, NOT_HERE)],
    "L3": [({"mem_ratio": 4.0, "copy_gain": None}, GPU),
           ({"mem_ratio": 4.0, "copy_gain": 3.5}, HOLDS),
           ({"mem_ratio": 4.0, "copy_gain": 1.5}, "holds only when the copy is large enough to be bandwidth-bound"),
           ({"mem_ratio": 4.0, "copy_gain": 1.0}, NOT_HERE),
           ({"mem_ratio": 2.0, "copy_gain": 3.5}, NOT_HERE)],
    "L4": [({"in_ram_gain": 30, "read_share": 0.05, "ramdisk_gain": 1.0}, HOLDS),
           ({"in_ram_gain": 3, "read_share": 0.6}, HOLDS),
           ({"in_ram_gain": 30, "read_share": 0.05, "ramdisk_gain": 1.5},
            "holds only when the files are read from a slow disk"),
           ({"in_ram_gain": 1.1, "read_share": 0.6, "ramdisk_gain": 1.5}, NOT_HERE)],
    "L5": [({"gain": 2.0}, HOLDS), ({"gain": 1.2}, "holds only when the preprocessing is a large part of the epoch"),
           ({"gain": 1.0}, NOT_HERE)],
    "L6": [({"on_gpu": False, "epoch_ratio": 20, "feed_ratio": 50}, GPU),
           ({"on_gpu": True, "epoch_ratio": 12, "feed_ratio": 50}, HOLDS),
           ({"on_gpu": True, "epoch_ratio": 3, "feed_ratio": 50},
            "holds only when the training step is fast next to the CPU pipeline"),
           ({"on_gpu": True, "epoch_ratio": 3, "feed_ratio": 4}, NOT_HERE)],
    "L7": [({"synthetic": True, "worst_mean_drop": 0.1, "seed_spread": 0.0}, REAL_DATA),
           ({"synthetic": False, "worst_mean_drop": 0.05, "seed_spread": 0.01}, HOLDS),
           ({"synthetic": False, "worst_mean_drop": 0.03, "seed_spread": 0.02}, NOT_HERE),
           ({"synthetic": False, "worst_mean_drop": 0.005, "seed_spread": 0.0}, NOT_HERE)],
    "L8": [({"diff_mlp": 1e-7, "diff_gn": 1e-7, "diff_bn": 0.05},
            "holds only when the loss is divided by k and the model has no batch norm"),
           ({"diff_mlp": 1e-7, "diff_gn": 1e-7, "diff_bn": 1e-5}, HOLDS),
           ({"diff_mlp": 1e-2, "diff_gn": 1e-7, "diff_bn": 0.05}, NOT_HERE)],
    "L9": [({"graph_bytes": 1e6, "after_backward_bytes": 5e5, "activation_bytes": 1e6}, HOLDS),
           ({"graph_bytes": 1e6, "after_backward_bytes": 100, "activation_bytes": 1e6},
            "holds only when the loss's graph has not been freed by backward()"),
           ({"graph_bytes": 1e3, "after_backward_bytes": 100, "activation_bytes": 1e6}, NOT_HERE)],
    "L10": [({"on_gpu": False, "round_trip_vs_on_device": None}, GPU),
            ({"on_gpu": True, "round_trip_vs_on_device": 40.0}, HOLDS),
            ({"on_gpu": True, "round_trip_vs_on_device": 1.3}, NOT_HERE)],
    "L11": [({"on_gpu": False, "slowdown": 1.0}, GPU), ({"on_gpu": True, "slowdown": 1.5}, HOLDS),
            ({"on_gpu": True, "slowdown": 1.02}, NOT_HERE)],
    "L12": [({"on_gpu": False, "speedup": 1.0, "memory_ratio": 1.0}, GPU),
            ({"on_gpu": True, "speedup": 2.0, "memory_ratio": 1.8}, HOLDS),
            ({"on_gpu": True, "speedup": 1.0, "memory_ratio": 1.8},
             "holds only when the model is large enough to be compute-bound"),
            ({"on_gpu": True, "speedup": 2.0, "memory_ratio": 1.1}, NOT_HERE)],
    "L13": [({"on_gpu": False, "gpu_vs_cpu_time": None}, GPU), ({"on_gpu": True, "gpu_vs_cpu_time": 1.5}, HOLDS),
            ({"on_gpu": True, "gpu_vs_cpu_time": 0.5}, NOT_HERE)],
    "L14": [({"gpus": 1, "imbalance_outside": None, "imbalance_inside": None}, GPUS2),
            ({"gpus": 2, "imbalance_outside": 1.5, "imbalance_inside": 1.05}, HOLDS),
            ({"gpus": 2, "imbalance_outside": 1.02, "imbalance_inside": 1.0}, NOT_HERE),
            ({"gpus": 2, "imbalance_outside": 1.5, "imbalance_inside": 1.6}, NOT_HERE)],
    "L15": [({"gpus": 0, "less_time": None}, GPUS2), ({"gpus": 4, "less_time": 0.2}, HOLDS),
            ({"gpus": 2, "less_time": 0.05}, NOT_HERE)],
    "L16": [({"prefix_load_failed": True}, HOLDS), ({"prefix_load_failed": False}, NOT_HERE)],
    "L17": [({"utilisation": 0.48, "handoff_share": 0.05}, HOLDS),
            ({"utilisation": 0.48, "handoff_share": 0.005}, "holds only when the activations handed over are large"),
            ({"utilisation": 0.9, "handoff_share": 0.05}, NOT_HERE)],
    "L18": [({"lr_losses": (0.5, 1.2, 0.6)}, "holds (learning-rate part)"),
            ({"lr_losses": (0.5, 1.2, 1.3)}, NOT_HERE),
            ({"ddp_vs_global": 1e-7, "bn_spread": 1e-3}, "holds (batch-norm part)"),
            ({"ddp_vs_global": 1e-7, "bn_spread": 1e-9}, NOT_HERE),
            ({"ddp_vs_global": 1e-2, "bn_spread": 1e-3}, NOT_HERE)],
    "L19": [({"odd_world_finished": True}, NOT_HERE), ({"odd_world_finished": False}, HOLDS)],
    "L20": [({"ratio": 120}, HOLDS), ({"ratio": 12}, "holds only when the loop runs over many elements"),
            ({"ratio": 2}, NOT_HERE)],
    "L21": [({"data_loop_kind": "input-bound", "compute_loop_kind": "gpu-bound",
              "compute_kinds_expected": ("gpu-bound", "launch-bound")}, "advice: supported here"),
            ({"data_loop_kind": "cpu-compute-bound", "compute_loop_kind": "cpu-compute-bound",
              "compute_kinds_expected": ("cpu-compute-bound",)}, "advice: not supported here")],
    "L22": [({"code_gain": 3.0, "hardware_gain": None}, "needs a run on other hardware"),
            ({"code_gain": 3.0, "hardware_gain": 40.0, "cost_here": 1.0, "cost_other": 0.5}, HOLDS),
            ({"code_gain": 3.0, "hardware_gain": 40.0, "cost_here": 1.0, "cost_other": 2.0},
             "holds only when the time saved is worth the higher price"),
            ({"code_gain": 3.0, "hardware_gain": 2.0, "cost_here": 1.0, "cost_other": 0.5}, NOT_HERE)],
    "L23": [({"gpus": 1, "acc_one": 0.9, "acc_two": None}, GPUS2),
            ({"gpus": 2, "acc_one": 0.9, "acc_two": 0.67}, HOLDS),
            ({"gpus": 2, "acc_one": 0.9, "acc_two": 0.89}, NOT_HERE)],
}


def reached(claim: str) -> set[str]:
    return {judge(claim, **m) for m, _ in CASES[claim]}


def test_every_claim_has_a_rule_and_cases():
    assert set(RULES) == set(claims.CLAIMS) == set(CASES)


@pytest.mark.parametrize("claim", list(claims.CLAIMS))
def test_rule_gives_each_verdict_from_measurements(claim):
    r = RULES[claim]
    for measured, expected in CASES[claim]:
        assert judge(claim, **measured) == expected, (claim, measured)
    assert reached(claim) == set(r.verdicts), f"{claim}: verdicts never reached: {set(r.verdicts) - reached(claim)}"
    assert len(r.verdicts) >= 2
    assert r.compares and r.threshold
    assert all(claims.kind_of(v) for v in r.verdicts)
    if r.advice:
        assert all(v.startswith("advice") for v in r.verdicts)


def test_a_rule_with_one_verdict_fails_the_check(monkeypatch):
    const = Rule("L16", "nothing", "none", (HOLDS,), lambda prefix_load_failed: HOLDS)
    monkeypatch.setitem(RULES, "L16", const)
    with pytest.raises(AssertionError):
        test_rule_gives_each_verdict_from_measurements("L16")


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
    assert tested_in["L4"] == ["02", "05"]  # teaching order, by notebook number


def test_the_catalog_refuses_a_claim_the_ledger_does_not_know(tmp_path):
    toml = tmp_path / "catalog.toml"
    toml.write_text('[[notebook]]\nfile = "01_x.ipynb"\ntitle = "x"\nneeds = "cpu"\nclaims = ["L3", "L99"]\n')
    with pytest.raises(ValueError, match=r"'01_x.ipynb' lists unknown claim\(s\) \['L99'\]"):
        catalog.load(toml)


@pytest.mark.parametrize("entry", catalog.load(), ids=lambda e: e["file"])
def test_each_notebook_judges_exactly_the_claims_the_catalog_lists(entry):
    """The catalog's claim list of a notebook is the claims its code judges (`rec.judge("L..."`)."""
    nb = nbformat.read(catalog.CATALOG.parent / entry["file"], as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert set(re.findall(r"\.judge\(\s*[\"'](L\d+)[\"']", code)) == set(entry.get("claims", []))
