"""Notebook 16's DDP training script (the text its `%%writefile {TRAIN_PY}` cell writes), run in
real processes: N ranks reach the weights of one process trained on the global batch; and
notebook 18's failing DDP loop (its `%%writefile {FAIL_PY}` cell): the rank that failed is named."""

from __future__ import annotations

import pytest
import torch

from helpers import launch
from tests.notebook_scripts import write_script

pytestmark = pytest.mark.slow  # trains with two ranks

SMALL = [
    "--in-features",
    32,
    "--hidden",
    64,
    "--depth",
    2,
    "--steps-per-epoch",
    3,
    "--epochs",
    2,
    "--lr",
    0.1,
]


def test_ddp_matches_one_process_on_the_global_batch(tmp_path):
    script = write_script("16_ddp.ipynb", "TRAIN_PY", tmp_path / "train_ddp.py")
    ddp = launch.run(script, [*SMALL, "--batch", 8], nprocs=2, stream=False, timeout=180)
    one = launch.run(script, [*SMALL, "--batch", 16], nprocs=1, stream=False, timeout=180)
    other = launch.run(script, [*SMALL, "--batch", 8], nprocs=1, stream=False, timeout=180)
    assert sorted(ddp.results) == [0, 1] and ddp.results[0]["world"] == 2
    assert ddp.results[0]["checksum"] == ddp.results[1]["checksum"]  # replicas stay identical
    got, want, wrong = (torch.load(r.folder / "checkpoint.pt") for r in (ddp, one, other))
    assert sorted(got) == sorted(want) and not any(k.startswith("module.") for k in got)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)
    # and the check can fail: one process on the per-rank batch trains on other data
    assert any((got[k] - wrong[k]).abs().max() > 1e-4 for k in want)


def test_a_failing_rank_is_named(tmp_path):
    script = write_script(
        "18_many_machines_and_sharding.ipynb", "FAIL_PY", tmp_path / "fail_ddp.py"
    )
    try:
        launch.run(script, ["--fail-rank", 1], nprocs=2, stream=False, timeout=180)
    except launch.LaunchError as e:
        assert e.failed_rank == 1 and "deliberate failure at step 2" in e.traceback
    else:
        raise AssertionError("the run with --fail-rank 1 did not fail")
