"""The capstone's performance bars, as ratios measured side by side in one process: the whole
of `make bench` (notebook 19 executed headless), its table read back.

- Any machine: the d2l reference loop (ToTensor per sample, 4 DataLoader workers) is slower than
  the same training with the uint8 data set in memory, at the smoke profile's narrow width where
  the input pipeline is a visible share (measured 2-6x on a loaded 2-core machine).
- GPU: the full fast recipe trains a Fashion-MNIST epoch faster than the reference beyond the
  measured noise, in at most 1.0 s on an H100, and keeps the accuracy within one point (the
  notebook asserts it); the measured ratio is recorded, and the bound is raised from it (below).

    FTG_PROFILE=smoke .venv/bin/pytest -q -m benchmark benchmarks/test_capstone_ratio.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from benchmarks import capstone as bench
from helpers import devices


def _run_bench(tmp_path, monkeypatch, argv: list[str]) -> list[dict]:
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path))
    assert bench.main(argv) == 0, "notebook 19 failed (the fast recipe lost accuracy, or an error)"
    return json.loads((tmp_path / "results" / "bench_capstone.json").read_text())["bench_table"]


def _rows_of_the_run_alone() -> list[dict] | None:
    """The waterfall of the capstone's run alone in `make test-load` (tests/test_under_load.py
    leaves its results in FTG_ALONE_RESULTS): a quiet smoke run, the one this ratio needs, so CI
    does not run the capstone once more for it. None when that pass did not run (`make bench`)."""
    folder = os.environ.get("FTG_ALONE_RESULTS")
    if not folder:
        return None
    done = Path(folder) / "19_capstone.json"
    assert done.is_file(), f"the load pass's run alone of the capstone left no {done}"
    recorded = json.loads(done.read_text())
    assert recorded["profile"] == "smoke", recorded["profile"]
    return bench.bench_rows(recorded)


@pytest.mark.benchmark
@pytest.mark.load  # after the load pass's runs alone, whose capstone run it reads: `make test-load`
def test_in_memory_uint8_beats_the_reference_loader(tmp_path, monkeypatch):
    # smoke profile (one CPU thread: shared cores make threads noisy; 3 timed epochs, as in
    # every profile, so that the keep rule's spread is measured); run here only without the load
    # pass: a cell past 300 s (the longest takes about 100 s here) is a hang, which fails the run
    # instead of holding CI for the default 30 minutes; one epoch of each accuracy run (section
    # 5, untimed: not what this ratio is about)
    rows = _rows_of_the_run_alone()
    if rows is None:
        argv = ["--profile", "smoke", "--accuracy-epochs", "1", "--timeout", "300"]
        rows = _run_bench(tmp_path, monkeypatch, argv)
    ref, mem = rows[0], next(r for r in rows if r["step"] == "uint8 in memory")
    ratio = ref["seconds_per_epoch"] / mem["seconds_per_epoch"]
    print(f"uint8 in memory is {ratio:.2f}x the d2l reference loader")
    assert ratio > 1.2


# The GPU bound. At 28x28 the book's loop is GPU-bound rather than input-bound (cuDNN already
# runs its fp32 convolutions in TF32 on Ampere and Hopper), so before a measurement only this can
# be defended: the fast recipe beats the reference beyond the measured noise (the waterfall's
# own keep rule: more than 2 % and more than either timing's spread) and, on an H100, trains an
# epoch in at most 1.0 s. The measured ratio is printed and recorded (bench_capstone.json,
# record_property "ratio"): once a GPU run has measured it, raise MIN_GPU_RATIO to about 80 %
# of the measured ratio on that card.
MIN_GPU_RATIO = 1.0


@pytest.mark.benchmark
@pytest.mark.gpu
def test_fast_recipe_on_gpu(tmp_path, monkeypatch, record_property):
    if devices.accelerator() != "cuda":
        pytest.skip(
            "needs a CUDA GPU: the fast recipe beats the reference beyond noise and, "
            "on an H100, trains an epoch in <= 1.0 s"
        )
    rows = _run_bench(tmp_path, monkeypatch, ["--reference-dir", str(tmp_path / "reference")])
    ref, fast = rows[0], [r for r in rows if r["kept"]][-1]
    record_property("ratio", fast["ratio"])
    record_property("fast_seconds_per_epoch", fast["seconds_per_epoch"])
    print(
        f"fast recipe ({fast['step']} stack): {fast['seconds_per_epoch']:.3f} s/epoch, "
        f"{fast['ratio']:.2f}x the reference ({ref['seconds_per_epoch']:.3f} s/epoch) "
        f"on {torch.cuda.get_device_name()}"
    )
    graphs = [r for r in rows if r["step"] == "+ CUDA graphs"]
    if graphs and graphs[0]["cuda_graphs_used"] is not None:
        print(f"CUDA graphs used: {graphs[0]['cuda_graphs_used']} ({graphs[0]['note']})")
    assert fast is not ref, "no change beat the book's loop beyond noise on this GPU"
    gain = ref["seconds_per_epoch"] - fast["seconds_per_epoch"]
    assert gain > max(ref["spread_s"], fast["spread_s"]), (
        "the speed-up is inside the measured spread"
    )
    assert fast["ratio"] > MIN_GPU_RATIO
    if "H100" in torch.cuda.get_device_name():
        assert fast["seconds_per_epoch"] <= 1.0
