"""Issue 6's performance bars, as ratios measured side by side in one process.

- CPU (any machine): the d2l reference loop (ToTensor per sample, 4 DataLoader workers) is
  slower than the same training with the uint8 data set in memory, at a narrow width where the
  input pipeline is a visible share (robust on a loaded 2-core machine: measured 2-6x there).
- GPU: the full fast recipe trains a Fashion-MNIST epoch at least 8x faster than the reference,
  at most 1.0 s on an H100, and keeps the accuracy within one point (the whole `make bench`).

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


@pytest.mark.benchmark
@pytest.mark.gpu
def test_fast_recipe_on_gpu(tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: the fast recipe's bar (>= 8x, <= 1.0 s/epoch on an H100)")
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path))
    rc = bench.main(["--reference-dir", str(tmp_path / "reference")])
    assert rc == 0, "the fast recipe lost more than one point of accuracy"
    rows = json.loads((tmp_path / "results" / "bench_capstone.json").read_text())["bench_table"]
    fast = [r for r in rows if r["kept"]][-1]
    assert fast["ratio"] >= 8, f"fast recipe only {fast['ratio']:.1f}x the reference"
    if "H100" in torch.cuda.get_device_name():
        assert fast["seconds_per_epoch"] <= 1.0
