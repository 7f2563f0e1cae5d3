"""The bottleneck doctor: each constructed bottleneck is named, the fine loop gets no false
finding, each threshold is tested on both sides, and the engine's step counting holds up
(a second optimizer, LBFGS, no optimizer at all)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from PIL import Image, ImageFilter
from torch import nn
from torch.nn import functional as F
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset

from helpers import devices, diagnose, doctor
from helpers.doctor import counting, rules, watcher
from helpers.doctor.counting import OpCounter
from helpers.doctor.session import Session
from helpers.processes import usable_cores as cores
from tests.notebook_scripts import write_script


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Blurred(Dataset):
    """Heavy per-sample work on the CPU: upsize and blur an image in PIL."""

    def __init__(self, n: int = 256, size: int = 256) -> None:
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 255, (n, 16, 16), dtype=np.uint8)
        self.size = size

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        img = Image.fromarray(self.images[i]).resize((self.size, self.size), Image.BICUBIC)
        img = img.filter(ImageFilter.GaussianBlur(3))
        return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255)[None], i % 10


def batched(n: int, d: int, batch: int) -> DataLoader:
    """Tensors fetched a whole batch at a time (one indexing op, no per-sample collate)."""
    ds = TensorDataset(torch.randn(n, d), torch.randint(0, 10, (n,)))
    return DataLoader(
        ds, sampler=BatchSampler(RandomSampler(ds), batch, drop_last=True), batch_size=None
    )


def train(loader, net, *, read_every_step: bool = False, **kw) -> doctor.Watch:
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    w = doctor.watch(loader, quiet=True, **kw)
    for X, y in w:
        loss = F.cross_entropy(net(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if read_every_step:
            assert loss.item() == loss.item()  # a read of the loss every step
    return w


def tiny_ops_net(depth: int = 40, width: int = 16) -> nn.Module:
    return nn.Sequential(
        *[m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())],
        nn.Linear(width, 10),
    )


def kinds(w: doctor.Watch) -> list[str]:
    return [f.kind for f in w.findings]


def test_input_bound_loop_is_named_and_its_workers_trial_measured():
    torch.set_num_threads(1)
    net = nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4, 10))
    w = train(DataLoader(Blurred(), batch_size=8), net, timed=4, trial_steps=3)
    assert kinds(w)[0] == "input-bound", w.findings
    if cores() > 1:
        assert w.findings[0].predicted_speedup is not None and "workers" in w.measured.trials


def test_overhead_bound_loop_is_named_with_a_batch_trial():
    torch.set_num_threads(1)
    w = train(batched(2048, 16, 4), tiny_ops_net(), timed=4, trial_steps=3)
    m = w.measured
    assert kinds(w)[0] == "overhead-bound", (
        w.findings,
        m.ops_per_step,
        m.dispatch_s,
        m.best_step_s,
    )
    # the trial ran and predicts a speed; how much faster is a ratio: benchmarks/test_doctor_bars.py
    assert w.findings[0].predicted_speedup is not None and "batch x2" in w.measured.trials


def test_fine_loop_gets_no_false_finding():
    # Narrow inputs, a wide layer: fetching a batch gathers 256 KB (a fraction of a ms) for a
    # step of about 1.7 GFLOP (tens of ms on one thread), so the wait stays near 1 %, far below
    # the 5 % rule even on a busy machine. (1,024-wide inputs into a 1,024-wide layer: 1 MB for
    # 1 GFLOP, which measured 5.0 % here: on the rule's edge.)
    torch.set_num_threads(1)
    net = nn.Sequential(nn.Linear(256, 4096), nn.ReLU(), nn.Linear(4096, 10))
    w = train(batched(4096, 256, 256), net, timed=4)
    # device-bound (near or below its ceiling: the rate decides), never "compute-bound"
    assert len(w.findings) == 1 and kinds(w)[0] in rules.DEVICE_BOUND, w.findings
    assert "of this machine's measured float32 matmul rate" in w.findings[0].evidence
    assert w.findings[0].kind == rules.verdict(w.measured).kind


def test_sync_on_a_cpu_is_counted_not_costed():
    torch.set_num_threads(1)
    net = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    w = train(batched(4096, 1024, 256), net, timed=4, read_every_step=True)
    sync = next(f for f in w.findings if f.kind == "sync-bound")
    assert sync.share is None and "would synchronise on a GPU" in sync.evidence
    assert w.measured.sync_ops == {"_local_scalar_dense": 2}
    after = w.findings[w.findings.index(sync) :]  # ranked below every measured cost
    assert all(f.share is None or rules.refuted(f) for f in after)


def test_oversubscribed_threads_are_named():
    torch.set_num_threads(cores() + 2)
    net = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    w = train(batched(4096, 256, 64), net, timed=3, trial_steps=3)
    f = next(f for f in w.findings if f.kind == "oversubscribed-threads")
    assert f.fix == f"torch.set_num_threads({cores()})" and "threads" in w.measured.trials
    assert torch.get_num_threads() == cores() + 2  # the trial gave the threads back


def test_only_the_first_optimizer_counts_and_lbfgs_steps_once():
    a, b = nn.Linear(4, 1), nn.Linear(4, 1)
    first, second = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.Adam(b.parameters())
    lbfgs = torch.optim.LBFGS(a.parameters(), max_iter=5)
    s = Session(warmup=1, timed=3, profiled=1, counted=1).start()
    try:
        for _ in range(3):
            first.step()
            second.step()  # a GAN's second optimizer: ignored
        assert s.steps == 3
    finally:
        s.close()
    x = torch.randn(8, 4)

    def closure():
        lbfgs.zero_grad()
        loss = a(x).pow(2).mean()
        loss.backward()
        return loss

    s = Session(warmup=1, timed=3, profiled=1, counted=1).start()
    try:
        for _ in range(2):
            lbfgs.step(closure)
        assert s.steps == 2  # the closure ran several times per step
    finally:
        s.close()


def test_a_loop_without_optimizer_step_gets_a_clear_error():
    w = doctor.watch(batched(64, 4, 2), quiet=True)
    with pytest.raises(RuntimeError, match="no optimizer step"):
        for _ in w:
            pass


def test_counter_sees_item_bool_and_nonzero_but_not_cpu():
    x = torch.randn(16)
    with OpCounter() as c:
        x.sum().item()
        bool(x[0] > 0)
        x.nonzero()
        x.cpu(), x.tolist(), x.numpy()
    assert c.syncs == {"_local_scalar_dense": 2, "nonzero": 1}


def test_bad_input_names_the_parameter():
    with pytest.raises(TypeError, match="watch: loader must be a torch.utils.data.DataLoader"):
        doctor.watch([1, 2, 3])
    with pytest.raises(ValueError, match="watch: timed must be an int >= 3, got 1"):
        doctor.watch(batched(64, 4, 2), timed=1)


# --- each threshold, just either side ------------------------------------------------------


def m(**kw) -> rules.Measured:
    base = dict(device="cpu", step_s=0.010, steps=20, batch_size=32, cores=2, threads=2)
    return rules.Measured(**{**base, **kw})


def test_input_bound_with_a_worker_per_core_is_not_told_to_add_workers():
    """Workers on every core already: more would take turns, so the fix is lighter loading."""
    few = rules.input_bound(m(wait_s=0.005, workers=1))
    full = rules.input_bound(m(wait_s=0.005, workers=2))
    assert "num_workers=2" in few.fix
    assert "num_workers" not in full.fix and "2 workers already have all 2" in full.fix


@pytest.mark.parametrize(
    "rule, below, above",
    [
        (
            rules.input_bound,
            dict(wait_s=0.010 * (rules.INPUT_WAIT_SHARE - 0.001)),
            dict(wait_s=0.010 * (rules.INPUT_WAIT_SHARE + 0.001)),
        ),
        (
            rules.overhead_bound,
            dict(ops_per_step=100, dispatch_s=0.010 * (rules.OVERHEAD_SHARE - 0.001) / 100),
            dict(ops_per_step=100, dispatch_s=0.010 * (rules.OVERHEAD_SHARE + 0.001) / 100),
        ),
        (  # against the fastest step where there is one (here half the median step)
            rules.overhead_bound,
            dict(
                best_step_s=0.005,
                ops_per_step=100,
                dispatch_s=0.005 * (rules.OVERHEAD_SHARE - 0.001) / 100,
            ),
            dict(
                best_step_s=0.005,
                ops_per_step=100,
                dispatch_s=0.005 * (rules.OVERHEAD_SHARE + 0.001) / 100,
            ),
        ),
        (
            rules.sync_bound,
            dict(syncs_per_step=rules.SYNCS_PER_STEP - 0.5),
            dict(syncs_per_step=rules.SYNCS_PER_STEP),
        ),
        (
            rules.sync_bound,
            dict(device="cuda", syncs_per_step=2, stall_s=0.010 * (rules.SYNC_STALL_SHARE - 0.001)),
            dict(device="cuda", syncs_per_step=2, stall_s=0.010 * (rules.SYNC_STALL_SHARE + 0.001)),
        ),
        (  # the device idles, the data is ready: overhead-bound (the verdict's last rule)
            rules.device_idle,
            dict(device="cuda", wait_s=0.0, busy=diagnose.DEVICE_BUSY + 0.001),
            dict(device="cuda", wait_s=0.0, busy=diagnose.DEVICE_BUSY - 0.001),
        ),
        (  # copies to the device that wait: copy-bound, on its own line
            rules.sync_bound,
            dict(
                device="cuda",
                syncs_per_step=2,
                sync_ops={rules.UPLOAD: 2},
                stall_s=0.010 * (rules.COPY_WAIT_SHARE - 0.001),
            ),
            dict(
                device="cuda",
                syncs_per_step=2,
                sync_ops={rules.UPLOAD: 2},
                stall_s=0.010 * (rules.COPY_WAIT_SHARE + 0.001),
            ),
        ),
        (
            rules.memory_tight,
            dict(memory_peak=rules.MEMORY_PEAK_SHARE - 0.001, memory_total=1.0),
            dict(memory_peak=rules.MEMORY_PEAK_SHARE + 0.001, memory_total=1.0),
        ),
        (rules.oversubscribed, dict(threads=2, workers=0), dict(threads=3, workers=0)),
        (
            rules.no_tensor_cores,
            dict(device="cuda", tensor_cores_idle=True, hot_ops=[{"op": "mm bfloat16 contiguous"}]),
            dict(device="cuda", tensor_cores_idle=True, hot_ops=[{"op": "mm float32 contiguous"}]),
        ),
        (rules.oversubscribed, dict(threads=1, workers=1), dict(threads=2, workers=1)),
    ],
)
def test_threshold_either_side(rule, below, above):
    assert rule(m(**below)) is None
    assert rule(m(**above)) is not None


def test_ranking_puts_measured_costs_first_and_device_bound_only_alone():
    found = rules.findings(
        m(
            wait_s=0.002,
            syncs_per_step=3,
            sync_ops={"_local_scalar_dense": 3},
            ops_per_step=1000,
            dispatch_s=5e-6,
        )
    )
    assert [f.kind for f in found] == ["overhead-bound", "input-bound", "sync-bound"]
    assert rules.verdict(m(wait_s=0.002, ops_per_step=1000, dispatch_s=5e-6)).kind == (
        "overhead-bound"  # the largest wait over its line: 50 % dispatching, 20 % for data
    )
    assert [f.kind for f in rules.findings(FINE)] == ["device-bound"]


# every window filled: a little data wait and dispatch, the rest of a CPU's step in operators
FINE = m(wait_s=0.0001, ops_per_step=100, dispatch_s=1e-6)


def test_the_doctor_s_verdict_is_the_suite_s_classifier_on_its_shares():
    """On a CPU the operators run in series with the host's waits: busy is the rest."""
    s = rules.shares(FINE)
    assert s["data_wait"] == pytest.approx(0.01) and s["overhead"] == pytest.approx(0.01)
    assert s["busy"] == pytest.approx(0.98) and s["sync"] is s["copy"] is s["rate"] is None
    assert rules.verdict(FINE) == diagnose.bottleneck(**s)
    rated = m(**{**vars(FINE), "flops_per_step": 1e8, "matmul_flops_per_s": 1e10})
    assert rules.shares(rated)["rate"] == pytest.approx(1e8 / (0.010 - 0.0001) / 1e10)
    f = rules.findings(rated)[0]
    assert f.kind == "device-bound, near its ceiling" and "nothing to fix in the loop" in f.evidence
    gpu = m(device="cuda", wait_s=0.0, busy=0.9)  # a GPU: busy measured, not inferred
    assert rules.shares(gpu)["busy"] == 0.9 and rules.verdict(gpu).kind == "device-bound"
    mps = m(device="mps", wait_s=0.0, ops_per_step=10, dispatch_s=1e-6)  # kernels not timed
    assert rules.shares(mps)["busy"] == pytest.approx(0.999)  # the host blocked on the device
    assert rules.verdict(m(wait_s=0.0)).kind == "inconclusive"  # the dispatch not measured


def test_what_if_predicts_throughput():
    f = rules.overhead_bound(
        m(
            ops_per_step=1000,
            dispatch_s=5e-6,
            trials={"batch x2": rules.Trial("batch x2", 64 / 0.012, 0.012)},
        )
    )
    assert f.predicted_speedup == pytest.approx((64 / 0.012) / (32 / 0.010))
    assert f.predicted_samples_per_s == pytest.approx(64 / 0.012)


def test_a_fix_that_measured_slower_is_ranked_last_and_says_so():
    slower = {"workers": rules.Trial("workers", 32 / 0.020, 0.020)}
    found = rules.findings(m(wait_s=0.002, trials=slower))
    # still input-bound (20 % waiting): a fix that does not pay leaves the wait where it was
    assert [f.kind for f in found] == ["input-bound"]
    assert "made it slower (0.50x)" in found[0].evidence
    waits = rules.findings(m(wait_s=0.009, trials=slower))  # 90 % waiting: input-bound
    assert [f.kind for f in waits] == ["input-bound"]


def test_report_text_and_json_schema():
    mm = m(wait_s=0.005)
    found = rules.findings(mm)
    d = rules.as_dict(mm, found)
    assert set(d) == {"schema", "inconclusive", "verdict", "measured", "findings"}
    assert d["inconclusive"] is False and d["verdict"]["kind"] == "input-bound"
    import json

    import jsonschema

    schema = json.loads(rules.SCHEMA_FILE.read_text())
    jsonschema.validate(json.loads(json.dumps(d)), schema)
    with pytest.raises(jsonschema.ValidationError):  # the schema can fail: an unknown kind
        jsonschema.validate({**d, "findings": [{**d["findings"][0], "kind": "slow"}]}, schema)
    assert set(d["findings"][0]) >= {"kind", "evidence", "share", "fix", "notebook"}
    text = doctor.render(mm, found)
    assert "input-bound" in text and "03_dataloader_workers.ipynb" in text
    assert "Verdict: input-bound (waiting for data 50.0% >= 5%)" in text


# --- DataLoader workers under spawn / forkserver -------------------------------------------

ROOT = Path(__file__).resolve().parents[1]

# A loop the doctor has never seen, run as a notebook runs a cell: its `__main__` has no file
# (python -c), so workers started by spawn or forkserver cannot import the class defined there.
MAIN_DATASET = """
import json, multiprocessing as mp, sys, time
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from helpers import devices, doctor

class SlowSquares(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.01)  # heavy per-sample work: the loop waits for data
        return torch.full((8,), float(i)), i % 2

mp.set_start_method(sys.argv[1])
torch.set_num_threads(1)
net = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
w = doctor.watch(DataLoader(SlowSquares(), batch_size=4), timed=3, trial_steps=2, seconds=0)
for X, y in w:
    loss = F.cross_entropy(net(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(json.dumps({"findings": [[f.kind, f.evidence, f.fix] for f in w.findings],
                  "trials": sorted(w.measured.trials)}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_dataset_in_main_is_reported_not_tried_when_workers_import(method):
    r = subprocess.run(
        [sys.executable, "-c", MAIN_DATASET, method],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]  # the loop ran to its diagnosis: no crash
    out = json.loads(r.stdout.strip().splitlines()[-1])
    found = {kind: (evidence, fix) for kind, evidence, fix in out["findings"]}
    assert "input-bound" in found and "workers" not in out["trials"], out
    evidence, fix = found["workers-cannot-import"]
    assert f"start by {method!r}" in evidence and "SlowSquares is defined in __main__" in evidence
    assert "into a module" in fix
    assert "workers not tried" in found["input-bound"][0]


def test_workers_cannot_load_says_why_and_only_where_workers_import():
    ds = Blurred(n=8, size=16)  # a class of an importable module: workers can load it

    def loader(start: str, **kw) -> DataLoader:  # no worker starts before iter()
        return DataLoader(ds, num_workers=1, multiprocessing_context=start, **kw)

    assert watcher.workers_cannot_load(loader("spawn")) is None
    why = watcher.workers_cannot_load(loader("forkserver", collate_fn=lambda b: b))
    assert "start by 'forkserver'" in why and "the collate_fn" in why and "cannot be pickled" in why
    forked = loader("fork", collate_fn=lambda b: b)
    assert watcher.workers_cannot_load(forked) is None  # a fork's copy needs no pickling


SPAWNED_BATCH = """
import sys, torch
from torch.utils.data import DataLoader
from helpers.doctor import watcher
sys.path.insert(0, sys.argv[1])  # as the notebook does; spawn hands sys.path to the worker
from blurred_data import Blurred

ds = Blurred(n=16, size=32)
loader = DataLoader(ds, batch_size=8, num_workers=1, multiprocessing_context="spawn")
assert watcher.workers_cannot_load(loader) is None
X, y = next(iter(loader))
X0, y0 = next(iter(DataLoader(ds, batch_size=8)))
assert X.shape == (8, 1, 32, 32) and torch.equal(X, X0) and torch.equal(y, y0)
print("a spawned worker delivered", tuple(X.shape))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_your_own_loops_dataset_loads_in_spawned_workers(tmp_path):
    """Notebook 20 writes its Dataset to a module (`%%writefile {DATASET}`), so a worker started
    by spawn imports it; a class defined in a cell would fail there. In a process of its own
    (python -c, a `__main__` without a file, as a notebook's): spawn's resource tracker ends
    with it."""
    write_script("20_your_own_loop.ipynb", "DATASET", tmp_path / "blurred_data.py")
    r = subprocess.run(
        [sys.executable, "-c", SPAWNED_BATCH, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0 and "delivered (8, 1, 32, 32)" in r.stdout, r.stderr[-3000:]


# --- copies to the device that synchronise (CUDA's rule; "meta" stands in for a CUDA GPU) -----

PAGEABLE = f"_to_copy {rules.UPLOAD}, pageable"


@pytest.fixture
def meta_as_cuda(monkeypatch):
    """Copies to "meta" follow CUDA's rule: the counter's view of a GPU without one."""
    monkeypatch.setattr(counting, "UPLOAD_SYNCS", {"meta"})


def test_counter_names_copies_to_the_device_that_wait(meta_as_cuda, monkeypatch):
    x, dst = torch.randn(4), torch.empty(4, device="meta")
    with OpCounter() as c:  # pageable memory: a sync, non_blocking or not
        x.to("meta"), x.to("meta", non_blocking=True), dst.copy_(x, non_blocking=True)
    assert c.syncs == {PAGEABLE: 2, f"copy_ {rules.UPLOAD}, pageable": 1}
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, *a, **k: True)
    with OpCounter() as c:  # pinned: a sync only with non_blocking=False
        x.to("meta"), x.to("meta", non_blocking=True), dst.copy_(x, non_blocking=True)
    assert c.syncs == {f"_to_copy {rules.UPLOAD}, non_blocking=False": 1}


def test_copies_to_a_device_that_is_not_cuda_are_not_syncs():
    with OpCounter() as c:
        torch.randn(4).to("meta")
    assert not c.syncs and c.ops == 2  # randn, _to_copy


def test_a_loop_whose_only_syncs_are_pageable_copies_is_not_told_to_read_less(meta_as_cuda):
    torch.set_num_threads(1)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to("meta")
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    w = doctor.watch(batched(2048, 64, 32), quiet=True, timed=3, what_if=False)
    for X, y in w:  # the batches come from pageable memory, copied without pin_memory
        X, y = X.to("meta"), y.to("meta")
        loss = F.cross_entropy(net(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert w.measured.sync_ops == {PAGEABLE: 2}
    sync = next(f for f in w.findings if f.kind == "copy-bound")
    assert sync.fix == rules.UPLOAD_FIX and "read it every k steps" not in sync.fix
    assert "no read to remove" in sync.evidence and sync.notebook == "09_device_placement.ipynb"


@pytest.mark.parametrize("reads", [0, 1])
def test_a_measured_stall_with_copies_never_promises_the_read_fix_alone(reads):
    ops = {PAGEABLE: 2, **({"_local_scalar_dense": reads} if reads else {})}
    gpu = m(device="cuda", busy=0.4, stall_s=0.004, syncs_per_step=2 + reads, sync_ops=ops)
    sync = rules.sync_bound(gpu)
    assert sync.share == pytest.approx(0.4)  # the stall's share: what removing every sync frees
    assert sync.kind == ("sync-bound" if reads else "copy-bound")
    assert rules.UPLOAD_FIX in sync.fix
    if reads:  # the read fix only beside the copies' fix, and the evidence says why
        assert sync.fix.startswith(f"both: {rules.READ_FIX}")
        assert "reading less often alone gains nothing" in sync.evidence
    else:
        assert rules.READ_FIX not in sync.fix
    only_reads = rules.sync_bound(m(**{**vars(gpu), "sync_ops": {"_local_scalar_dense": 2}}))
    assert only_reads.fix == rules.READ_FIX and only_reads.notebook == "08_item_hygiene.ipynb"


def test_tf32_state_is_read_through_the_api_a_script_used():
    """A script that set TF32 the new way (notebook 11) makes the legacy getter raise on the
    GPU; the doctor reads the fp32_precision settings, and sees full fp32 by default."""
    from helpers.doctor import profiled

    assert profiled._matmul_fp32_precision() == "ieee"
    with devices.fp32_precision("tf32"):
        assert profiled._matmul_fp32_precision() == "tf32"
    assert profiled._matmul_fp32_precision() == "ieee"


def test_no_regime_and_no_all_clear_rests_on_a_window_that_did_not_fill():
    """The same numbers diagnose as device-bound when every window filled; with the profiled
    window missing, the rules that read it were not evaluated: no device-bound, inconclusive."""
    assert [f.kind for f in rules.findings(FINE)] == ["device-bound"]
    partial = m(
        **{**vars(FINE), "not_measured": ["the profiled window (data wait, device busy, syncs)"]}
    )
    partial.steps_needed = 9
    assert rules.inconclusive(partial) and rules.findings(partial) == []
    assert rules.verdict(partial).kind == "inconclusive"
    text = doctor.render(partial, [])
    assert "INCONCLUSIVE" in text and "of the 9 the doctor's windows need" in text
    assert "none from what was measured" in text


def test_a_sync_is_blamed_on_the_code_that_asked_for_it():
    """The user's own `.item()` is theirs (line and file); the reads inside L-BFGS's step are
    torch.optim.lbfgs's, called from the user's `opt.step(closure)` line."""
    from helpers.doctor.counting import OpCounter

    net = nn.Linear(4, 1)
    opt = torch.optim.LBFGS(net.parameters(), max_iter=3)
    X = torch.randn(8, 4)

    def closure():
        opt.zero_grad()
        loss = net(X).pow(2).mean()
        loss.backward()
        return loss

    with OpCounter() as c:
        closure().item()  # the user's read
        opt.step(closure)
    mine = [where for where, lib in c.sites if lib is None]
    libs = {lib for _, lib in c.sites if lib is not None}
    assert mine and all(w.startswith("test_doctor.py:") for w in mine), c.sites
    assert libs == {"torch.optim.lbfgs"}, c.sites


def test_syncs_inside_a_library_get_a_fix_the_user_can_make():
    sites = [{"where": "train.py:20", "library": "torch.optim.lbfgs", "per_step": 600.0}]
    f = rules.sync_bound(m(syncs_per_step=600, sync_ops={"_local_scalar_dense": 600}))
    assert f.fix == rules.READ_FIX  # no sites known: the read fix
    f = rules.sync_bound(
        m(syncs_per_step=600, sync_ops={"_local_scalar_dense": 600}, sync_sites=sites)
    )
    assert "none in your code: inside torch.optim.lbfgs (called from train.py:20)" in f.evidence
    assert f.fix != rules.READ_FIX and "how you call it" in f.fix
    mixed = sites + [{"where": "train.py:25", "library": None, "per_step": 1.0}]
    f = rules.sync_bound(
        m(syncs_per_step=601, sync_ops={"_local_scalar_dense": 601}, sync_sites=mixed)
    )
    assert "1 per step in your code" in f.evidence and f.fix == rules.READ_FIX


@pytest.mark.slow
def test_the_what_if_change_is_made_in_the_child_only():
    """The change --what-if carries is made by the doctor's child at its start (threads, held
    against the script's own call, TF32, the DataLoader's workers); this process, which imported
    the same module, is unchanged."""
    import json
    import os
    import subprocess
    import sys

    from helpers.doctor import whatif

    change = {"threads": 1, "fp32_precision": "tf32"}
    change["loader"] = {"num_workers": 2, "persistent_workers": True, "pin_memory": False}
    code = (
        "from helpers.doctor import whatif\n"
        "whatif.apply_in_child()\n"
        "import torch\n"
        "torch.set_num_threads(2)  # the script's own setting\n"
        "from torch.utils.data import DataLoader\n"
        "mine, theirs = DataLoader(range(8)), DataLoader(range(8), num_workers=1)\n"
        "print(torch.get_num_threads(), torch.backends.cuda.matmul.fp32_precision,\n"
        "      torch.backends.cudnn.conv.fp32_precision, mine.num_workers,\n"
        "      mine.persistent_workers, theirs.num_workers)\n"
    )
    env = {**os.environ, whatif.ENV: json.dumps(change), "OMP_NUM_THREADS": "2"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["1", "tf32", "tf32", "2", "True", "1"], out.stderr[-2000:]
    assert DataLoader(range(8)).num_workers == 0 and whatif.ENV not in os.environ
    assert isinstance(torch.set_num_threads, types.BuiltinFunctionType)  # torch's own, unwrapped


def test_the_warm_up_covers_each_worker_and_a_run_bounded_in_steps_keeps_its_length():
    from helpers.doctor.session import WARMUP_PER_WORKER, Session

    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    extra = 2 * WARMUP_PER_WORKER  # two workers
    for seconds, timed in ((0.0, 10 - extra), (0.3, 10)):
        s = Session(warmup=2, timed=10, seconds=seconds, workers=2).start()
        try:
            opt.step()  # the first step: the warm-up is sized here
        finally:
            s.close()
        assert (s.windows[0].steps, s.windows[1].steps) == (2 + extra, timed)


def test_the_report_says_how_it_counted_a_step():
    """A GAN's loop: the first optimizer's steps are the steps; the second's are inside them,
    and the report says so (a step is what the user would call one)."""
    from helpers.doctor.session import Session

    g, d = nn.Linear(4, 4), nn.Linear(4, 1)
    opt_d = torch.optim.SGD(d.parameters(), lr=0.01)
    opt_g = torch.optim.Adam(g.parameters(), lr=0.01)
    s = Session(warmup=1, timed=3, profiled=1, counted=1, seconds=0.0).start()
    try:
        for _ in range(4):
            d(g(torch.randn(8, 4))).mean().backward()
            opt_d.step()
            opt_g.step()
    finally:
        s.close()
    assert s.steps == 4 and s.opt is opt_d
    assert s.step_counting() == (
        "a step is the interval between two calls of SGD.step(); other optimizers, counted "
        "inside the step: Adam.step() 1 per step"
    )
    lbfgs = Session()
    lbfgs.opt = torch.optim.LBFGS(d.parameters())
    assert "LBFGS.step() (with its closure's forward and backward passes inside)" in (
        lbfgs.step_counting()
    )


def test_a_loop_that_ends_as_a_window_opens_leaves_no_instrument_running():
    """The profiler starts when the timed window closes; a loop that ends right there must not
    leave it running (nor a dispatch mode: the counted window's)."""
    from torch.autograd import _profiler_enabled  # the profiler's own state

    from helpers.doctor.session import Session

    net = nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for steps in (4, 5, 6):  # the profiled window just opened; the counted one; the memory one
        s = Session(warmup=1, timed=3, profiled=1, counted=1, seconds=0.0).start()
        try:
            for _ in range(steps):
                net(torch.randn(8, 4)).sum().backward()
                opt.step()
        finally:
            s.close()
        assert not _profiler_enabled(), steps
        assert not torch._C._is_torch_function_mode_enabled() and (
            torch._C._len_torch_dispatch_stack() == 0
        ), steps


@pytest.mark.parametrize(
    "line, runtime",
    [
        (
            "ERROR:2026-11-28 09:01:09 9239:9239 DeviceProperties.cpp:56] gpuGetDeviceCount failed",
            1,
        ),
        (
            "USDT:2026-11-28 09:01:09 9239:9239 SyncActivityProfilerHandler.cpp:39] profiler_start",
            1,
        ),
        ("W1128 10:41:32.766000 26419 torch/utils/cpp_extension.py:183] No CUDA runtime", 1),
        ("ERROR: my loss is nan at step 3", 0),  # the script's own: kept
        ("W1128 is a fine name for a run", 0),
    ],
)
def test_runtime_log_lines_are_told_from_the_scripts_own(line, runtime):
    from helpers.doctor import cli

    assert bool(cli.RUNTIME_LOG.match(line)) == bool(runtime)


def test_an_overhead_estimate_past_the_step_is_not_printed_as_a_share_of_it():
    within = rules.overhead_bound(m(ops_per_step=100, dispatch_s=0.010 * 0.5 / 100))
    past = rules.overhead_bound(m(ops_per_step=100, dispatch_s=0.010 * 1.5 / 100))
    assert "= 50 % of the 10.00 ms fastest step" in within.evidence
    assert "= 15.00 ms, at least the whole 10.00 ms fastest step" in past.evidence
    assert past.share == 1.0


# --- memory over time ----------------------------------------------------------------------


def feature_bank(detach: bool) -> doctor.Watch:
    """A loop that keeps each step's features for a later metric: with their graph (the batch
    the first layer saved, 256 KiB a step) or detached (the 4 KiB features alone)."""
    torch.set_num_threads(1)
    net = nn.Sequential(nn.Linear(1024, 16), nn.ReLU(), nn.Linear(16, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    bank = []
    w = doctor.watch(batched(8192, 1024, 64), quiet=True, timed=3, what_if=False)
    for X, y in w:
        features = net[:2](X)
        bank.append(features.detach() if detach else features)  # the line blamed
        loss = F.cross_entropy(net(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return w


def test_features_kept_with_their_graph_grow_and_are_named_first_with_the_line():
    from helpers.doctor.memory import GROWTH_FLOOR, MEMORY_STEPS

    w = feature_bank(detach=False)
    m = w.measured
    assert kinds(w)[0] == "memory-growth" and "compute-bound" not in kinds(w), w.findings
    assert len(m.memory_samples) == MEMORY_STEPS and m.memory_slope >= GROWTH_FLOOR
    f = w.findings[0]
    assert ".detach()" in f.fix and ".item()" in f.fix and "del " in f.fix
    here = Path(__file__).name
    assert all(s["where"].startswith(f"{here}:") for s in m.memory_sites), m.memory_sites
    assert f"{here}:" in f.evidence and "MiB a step" in f.evidence
    assert "memory peak" in doctor.render(m, w.findings) or m.memory_peak is None


def test_detached_features_do_not_grow_past_the_floor():
    w = feature_bank(detach=True)
    assert "memory-growth" not in kinds(w), w.findings
    assert w.measured.memory_slope is not None and w.measured.memory_slope >= 0


def test_the_trend_is_a_least_squares_slope_against_its_scatter():
    from helpers.doctor.memory import GROWTH_FLOOR, growing, trend

    slope, spread, error = trend([10.0 + 3 * i for i in range(8)])
    assert slope == pytest.approx(3.0) and spread == pytest.approx(0.0, abs=1e-9)
    assert growing(GROWTH_FLOOR, 0.0) and not growing(GROWTH_FLOOR - 1, 0.0)
    wobble = [0.0, 1.0] * 4  # up and down by a MiB: a slope, but inside its own scatter
    slope, spread, error = trend([2**20 * v for v in wobble])
    assert slope > 0 and not growing(slope, error)


def test_while_memory_grows_there_is_no_all_clear():
    from helpers.doctor.memory import GROWTH_FLOOR

    grows = dict(memory_samples=[0.0] * 8, memory_slope=GROWTH_FLOOR, memory_slope_error=0.0)
    busy = dict(wait_s=0.0001, ops_per_step=10, dispatch_s=1e-6)  # the device bounds the loop
    assert [f.kind for f in rules.findings(m(**busy))] == ["device-bound"]
    assert [f.kind for f in rules.findings(m(**busy, **grows))] == ["memory-growth"]
    found = rules.findings(m(**{**busy, "wait_s": 0.005}, **grows))  # first, above a 50 % cost
    assert [f.kind for f in found] == ["memory-growth", "input-bound"]
    assert "line that made them was not seen" in found[0].evidence
    slow = rules.findings(m(**busy, **{**grows, "memory_slope": GROWTH_FLOOR - 1}))
    assert [f.kind for f in slow] == ["device-bound"]


# --- compare: two reports, before and after ------------------------------------------------


def report_file(tmp_path: Path, name: str, **kw) -> Path:
    mm = m(**kw)
    path = tmp_path / name
    path.write_text(json.dumps(rules.as_dict(mm, rules.findings(mm))))
    return path


def test_compare_inside_the_band_is_no_measurable_change(tmp_path, capsys):
    from helpers.doctor import compare

    before = report_file(tmp_path, "a.json", wait_s=0.005, step_spread_s=0.002)
    after = report_file(tmp_path, "b.json", step_s=0.0105, wait_s=0.005, step_spread_s=0.001)
    assert compare.main([str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert "no measurable change (+5 %" in out and "+-20 %" in out  # the spread: 2 of 10 ms
    assert "findings appeared: none" in out and "findings gone: none" in out


def test_compare_names_a_2x_faster_step_and_the_findings_that_changed(tmp_path, capsys):
    from helpers.doctor import compare

    before = report_file(tmp_path, "a.json", wait_s=0.005, step_spread_s=0.0005)
    after = report_file(
        tmp_path,
        "b.json",
        step_s=0.005,
        wait_s=0.00001,
        step_spread_s=0.0002,
        ops_per_step=10,
        dispatch_s=1e-6,
    )
    assert compare.main([str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert "2.00x faster (-50 % step time)" in out and "+-10 %" in out  # the floor
    assert "findings appeared: device-bound" in out and "findings gone: input-bound" in out
    c = compare.compare(json.loads(before.read_text()), json.loads(after.read_text()))
    assert c["measurable"] and c["gone"] == ["input-bound"]


def test_compare_from_the_command_line_and_on_a_file_that_is_no_report(tmp_path):
    before = report_file(tmp_path, "a.json", wait_s=0.005)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": rules.SCHEMA, "error": "the script failed"}))
    cmd = [sys.executable, "-m", "helpers.doctor", "compare"]
    ok = subprocess.run([*cmd, str(before), str(before)], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0 and "no measurable change (+0 %" in ok.stdout, ok.stderr
    no = subprocess.run([*cmd, str(before), str(bad)], cwd=ROOT, capture_output=True, text=True)
    assert no.returncode == 2 and "no diagnosis to compare (the script failed)" in no.stderr


def test_the_command_line_leaves_room_for_the_memory_window_or_says_it_did_not():
    from helpers.doctor import cli, memory

    assert cli.MEMORY_WINDOW == memory.MEMORY_STEPS  # the shell form's copy (it skips torch)
    mm = m()
    memory.read(types.SimpleNamespace(named=lambda _: None, memory=None, memory_steps=0), mm)
    assert f"--steps {cli.MIN_STEPS + cli.MEMORY_WINDOW} or more" in mm.unseen[-1]
    assert mm.memory_slope is None and rules.memory_growth(mm) is None


def test_where_the_device_counts_its_allocations_the_samples_are_its_count(monkeypatch):
    """A GPU's allocator counts every tensor it holds: the trend reads that count (faked here:
    a CPU stands in for a CUDA device), the dispatch mode only names the lines."""
    from helpers.doctor import memory

    held = iter([1e6 + 2**20 * i for i in range(memory.MEMORY_STEPS)])
    monkeypatch.setattr(memory.devices, "has_peak_memory_counter", lambda _: True)
    monkeypatch.setattr(memory.devices, "memory_allocated", lambda _: next(held))
    s = memory.Sampler(torch.device("cpu"))
    s.enter()
    try:
        for _ in range(memory.MEMORY_STEPS):
            s.sample()
    finally:
        s.exit()
    slope, _, error = memory.trend(s.samples)
    assert slope == pytest.approx(2**20) and memory.growing(slope, error)
    assert "memory_allocated" in s.source


@pytest.mark.slow  # starts DataLoader workers
@pytest.mark.parametrize("what_if", [False, True])
def test_a_watched_persistent_loader_s_workers_end_with_its_last_reference(what_if):
    """The watch keeps no reference cycle: dropping the loader and the watch ends a persistent
    loader's workers at once, not at a garbage collection some later step pays for (which joined
    the workers inside another watch's counted window: 10-40 s of one step)."""
    import gc

    net = nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4, 10))
    train(batched(64, 4, 8), nn.Linear(4, 10), timed=3)  # first-call imports, outside the check
    gc.collect()
    gc.disable()  # only reference counting may end the workers below
    try:
        loader = DataLoader(Blurred(n=64), batch_size=8, num_workers=2, persistent_workers=True)
        w = train(loader, net, timed=3, what_if=what_if)
        workers = psutil.Process().children()
        assert workers, "the loader started no workers: nothing to check"
        del loader, w
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"{len(alive)} worker(s) outlived their loader and its watch"
    finally:
        gc.enable()


def test_machine_rates_are_measured_again_only_when_stale(monkeypatch):
    """A notebook watches loop after loop: the machine's rates, about 1 s to measure, are
    reused within RATES_FRESH_S, per device, and measured again after it."""
    from helpers.doctor import profiled

    calls, now = [], [1000.0]
    monkeypatch.setattr(profiled, "_rates", {})
    monkeypatch.setattr(
        profiled, "measure_rates", lambda d, dtype: calls.append(str(d)) or (1e-6, 1e9)
    )
    monkeypatch.setattr(profiled.time, "monotonic", lambda: now[0])
    cpu, meta = torch.device("cpu"), torch.device("meta")
    profiled.machine_rates(cpu)
    profiled.machine_rates(cpu)
    profiled.machine_rates(meta)
    assert calls == ["cpu", "meta"]
    now[0] += profiled.RATES_FRESH_S + 1
    profiled.machine_rates(cpu)
    assert calls == ["cpu", "meta", "cpu"]


def test_a_busy_loop_far_below_its_ceiling_is_not_told_nothing_to_fix():
    """Small kernels keep a device busy at a fraction of its rate: the finding says how far
    below the ceiling (measured in the hot ops' dtype) and which levers raise it."""
    low = m(**{**vars(FINE), "flops_per_step": 1e6, "matmul_flops_per_s": 1e10})
    low.matmul_dtype = "bfloat16"
    f = rules.findings(low)[0]
    assert f.kind == "device-bound, below its ceiling"
    assert "nothing to fix" not in f.evidence and "measured bfloat16 matmul rate" in f.evidence
    assert "batch" in f.fix and "torch.compile" in f.fix


def test_the_ceiling_is_measured_in_the_dtype_the_hot_ops_ran_in():
    from helpers.doctor import profiled

    bf16_loop = {"mm bfloat16 contiguous": 30, "addmm float32 contiguous": 2}
    assert profiled.hot_dtype(bf16_loop) is torch.bfloat16
    assert profiled.hot_dtype({"convolution float16 channels_last": 4}) is torch.float16
    assert profiled.hot_dtype({}) is torch.float32  # nothing counted: fp32, as before
    assert profiled.hot_dtype({"mm float64 contiguous": 5}) is torch.float32  # no such ceiling
    r_bf16 = profiled.measure_rates(torch.device("cpu"), torch.bfloat16)
    assert r_bf16[1] > 0  # a bf16 matmul's rate, measured
