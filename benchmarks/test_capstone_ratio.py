"""The capstone's performance bars, as ratios measured side by side in one process.

- CPU (any machine): the d2l reference loop (ToTensor per sample, 4 DataLoader workers) is
  slower than the same training with the uint8 data set in memory, at a narrow width where the
  input pipeline is a visible share (robust on a loaded 2-core machine: measured 2-6x there).
- GPU: the full fast recipe trains a Fashion-MNIST epoch faster than the reference beyond the
  measured noise, in at most 1.0 s on an H100, and keeps the accuracy within one point (the whole
  `make bench`); the measured ratio is recorded, and the bound is raised from it (see below).

    FTG_PROFILE=smoke .venv/bin/pytest -q -m benchmark benchmarks/test_capstone_ratio.py
"""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import capstone as bench
from helpers import capstone
from helpers.threads import cpu_threads


@pytest.mark.benchmark
def test_in_memory_uint8_beats_the_reference_loader_on_cpu():
    d = capstone.load_data(512, 64)
    ref, changes = capstone.waterfall_changes(batch_size=64, lr=0.1, big_batch=64)
    mem = ref.but("uint8 in memory", data="memory")
    kw = dict(device="cpu", width=4, epochs=2, max_batches=3, busy_batches=0)
    t_ref, t_mem = [], []
    with torch.random.fork_rng(), cpu_threads(1):  # one thread: shared cores make threads noisy
        for _ in range(3):  # alternate, keep the best of each: load spikes hit both
            t_ref.append(capstone.measure(ref, d, **kw).seconds_per_epoch)
            t_mem.append(capstone.measure(mem, d, **kw).seconds_per_epoch)
    ratio = min(t_ref) / min(t_mem)
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
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: the fast recipe beats the reference beyond noise and, "
                    "on an H100, trains an epoch in <= 1.0 s")
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path))
    cudnn_before = torch.backends.cudnn.benchmark
    rc = bench.main(["--reference-dir", str(tmp_path / "reference")])
    assert torch.backends.cudnn.benchmark is cudnn_before, "the benchmark leaked cudnn.benchmark"
    assert rc == 0, "the fast recipe lost more than one point of accuracy"
    rows = json.loads((tmp_path / "results" / "bench_capstone.json").read_text())["bench_table"]
    ref, fast = rows[0], [r for r in rows if r["kept"]][-1]
    record_property("ratio", fast["ratio"])
    record_property("fast_seconds_per_epoch", fast["seconds_per_epoch"])
    print(f"fast recipe ({fast['step']} stack): {fast['seconds_per_epoch']:.3f} s/epoch, "
          f"{fast['ratio']:.2f}x the reference ({ref['seconds_per_epoch']:.3f} s/epoch) "
          f"on {torch.cuda.get_device_name()}")
    graphs = [r for r in rows if r["step"] == "+ CUDA graphs"]
    if graphs and graphs[0]["cuda_graphs_used"] is not None:
        print(f"CUDA graphs used: {graphs[0]['cuda_graphs_used']} ({graphs[0]['note']})")
    assert fast is not ref, "no change beat the book's loop beyond noise on this GPU"
    gain = ref["seconds_per_epoch"] - fast["seconds_per_epoch"]
    assert gain > max(ref["spread_s"], fast["spread_s"]), "the speed-up is inside the measured spread"
    assert fast["ratio"] > MIN_GPU_RATIO
    if "H100" in torch.cuda.get_device_name():
        assert fast["seconds_per_epoch"] <= 1.0
