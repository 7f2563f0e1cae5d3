"""`python -m helpers.doctor --nproc N`: N ranks as torchrun starts them, each under the doctor
with the same windows; the report adds each rank's step and time in collectives, and names the
straggler (under DDP: the rank that waits least). Also the DataParallel advice, and what
--nproc does with a script that never forms a process group."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from helpers import diagnose
from helpers.doctor import cli, rules, text
from tests.test_doctor_cli import ROOT, report

pytestmark = pytest.mark.doctor  # whole scripts in child processes: `make test-doctor`

# Two ranks of a small DDP loop on gloo, joined as torchrun's scripts join (env://, which the
# doctor's ranks meet through a file). Every rank "reads a batch" for 50 ms a step (a sleep:
# the same on a busy machine as on an idle one, and long enough that the straggler rule's 10 %
# floor is milliseconds); argv[1] names a rank that takes 50 ms more (-1: none), argv[2] one
# that fails at its third step (-1: none).
DDP = """
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

SLOW, FAIL = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
X, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
for step in range(1000):  # far more steps than the doctor needs: it stops every rank
    if step == 3 and rank == FAIL:
        raise RuntimeError(f"rank {rank} broken on purpose")
    loss = F.cross_entropy(net(X), y)
    time.sleep(0.05 + 0.05 * (rank == SLOW))  # reading a batch; the slow rank's takes longer
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"rank {rank} ran to its end")
"""

ALONE = """
import torch

torch.set_num_threads(1)
net = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for _ in range(1000):
    net(torch.randn(32, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
"""

DATA_PARALLEL = """
import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)
net = nn.DataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
X, y = torch.randn(64, 32), torch.randint(0, 10, (64,))
for _ in range(1000):
    loss = F.cross_entropy(net(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def doctor(
    tmp_path: Path, source: str, *args: str, script_args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-m", "helpers.doctor", *args, str(script), *script_args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _no_leftovers():
    mine = psutil.Process().children(recursive=True)
    assert not mine, f"processes left behind: {mine}"


@pytest.mark.timeout(300)
def test_the_straggler_is_the_rank_that_waits_least(tmp_path):
    r = doctor(tmp_path, DDP, "--nproc", "2", "--steps", "14", "--json", script_args=("1", "-1"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = report(r.stdout)
    ranks = out["ranks"]
    assert ranks["world_size"] == 2 and ranks["process_group"] is True
    zero, one = ranks["per_rank"]
    # rank 0 waits in the all-reduce for rank 1's extra 50 ms; rank 1 hardly waits
    assert zero["collective_s"] > one["collective_s"] + 0.025, ranks
    s = ranks["straggler"]
    assert s["rank"] == 1 and s["gap_s"] > 0.025 and s["gap_s"] > s["threshold_s"], s
    top = out["findings"][0]
    assert top["kind"] == "straggler" and top["notebook"] == "16_ddp.ipynb", out["findings"]
    assert "rank 1 is the straggler" in top["evidence"]
    assert f"they wait {1e3 * s['gap_s']:.1f} ms" in top["evidence"]
    assert top["share"] == pytest.approx(s["gap_s"] / s["step_s"])
    assert "rank 1 ran to its end" not in r.stdout + r.stderr  # stopped, both at one step
    assert (tmp_path / "train.py").read_text() == textwrap.dedent(DDP)  # never modified
    _no_leftovers()


@pytest.mark.timeout(300)
def test_a_balanced_job_names_no_straggler(tmp_path):
    r = doctor(tmp_path, DDP, "--nproc", "2", "--steps", "14", "--json", script_args=("-1", "-1"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = report(r.stdout)
    ranks = out["ranks"]
    assert ranks["straggler"] is None, ranks
    assert all(p["collective_s"] is not None for p in ranks["per_rank"])
    assert "straggler" not in {f["kind"] for f in out["findings"]}
    _no_leftovers()


@pytest.mark.timeout(300)
def test_a_rank_that_fails_is_named_and_every_rank_is_ended(tmp_path):
    """Rank 1 fails at its third step; rank 0 would wait for it in the all-reduce forever."""
    r = doctor(tmp_path, DDP, "--nproc", "2", "--json", script_args=("-1", "1"))
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-3000:])
    error = report(r.stdout)["error"]
    assert error == "rank 1: the script failed: RuntimeError: rank 1 broken on purpose", error
    assert "[rank 1] Traceback" in r.stderr  # its traceback, named by its rank
    _no_leftovers()


@pytest.mark.timeout(120)
def test_every_rank_is_ended_at_the_timeout(tmp_path):
    hangs = "import time\nwhile True:\n    time.sleep(0.1)\n"
    r = doctor(tmp_path, hangs, "--nproc", "2", "--timeout", "3")
    assert r.returncode == 3 and "ran past --timeout 3 s" in r.stderr, r.stderr[-2000:]
    _no_leftovers()


@pytest.mark.timeout(300)
def test_data_parallel_gets_the_ddp_advice(tmp_path):
    r = doctor(tmp_path, DATA_PARALLEL, "--steps", "14", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = report(r.stdout)
    assert out["measured"]["data_parallel"] is True
    (dp,) = [f for f in out["findings"] if f["kind"] == "data-parallel"]
    assert "DistributedDataParallel" in dp["fix"] and "15_data_parallel.ipynb" in dp["fix"]
    assert dp["notebook"] == "16_ddp.ipynb"
    for nb in (dp["notebook"], "15_data_parallel.ipynb"):
        assert (ROOT / "notebooks" / nb).is_file()
    _no_leftovers()


@pytest.mark.timeout(300)
def test_ranks_of_a_script_without_a_process_group_are_diagnosed_alone(tmp_path):
    r = doctor(tmp_path, ALONE, "--nproc", "2", "--steps", "14", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = report(r.stdout)
    ranks = out["ranks"]
    assert ranks["process_group"] is False and ranks["straggler"] is None
    assert [p["rank"] for p in ranks["per_rank"]] == [0, 1]
    assert all(p["collective_s"] is None for p in ranks["per_rank"])
    said = text.render(rules.measured_from(out["measured"]), [], ranks)
    assert "never called torch.distributed.init_process_group" in said
    assert "each rank ran the whole script alone" in said
    _no_leftovers()


@pytest.mark.parametrize(
    "value, said",
    [
        ("0", "--nproc must be an int >= 1, got 0"),
        ("two", "argument --nproc: invalid int value: 'two'"),
    ],
)
def test_nproc_refuses_what_is_not_a_count_of_ranks(tmp_path, value, said):
    r = doctor(tmp_path, "pass\n", "--nproc", value)
    assert r.returncode == 2 and said in r.stderr, r.stderr


def test_what_if_is_for_one_process(tmp_path):
    r = doctor(tmp_path, "pass\n", "--nproc", "2", "--what-if")
    assert r.returncode == 2 and "not with --nproc > 1" in r.stderr, r.stderr


def test_a_ranks_default_rendezvous_is_a_file_and_an_explicit_one_is_kept(monkeypatch):
    """env:// would start a TCPStore listening on every interface: the doctor's ranks meet
    through the file it made; what the script asks for explicitly, it gets."""
    import torch.distributed as dist

    calls = []

    def fake(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None):
        calls.append({"init_method": init_method, "rank": rank, "world_size": world_size})

    monkeypatch.setattr(dist, "init_process_group", fake)  # restored after the test
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    joined = []
    cli._join_through_file("file:///tmp/run/rendezvous", joined)
    dist.init_process_group("gloo")
    dist.init_process_group(backend="gloo", rank=1, world_size=2)
    dist.init_process_group("gloo", "tcp://127.0.0.1:1234", rank=0, world_size=2)
    assert calls == [
        {"init_method": "file:///tmp/run/rendezvous", "rank": 1, "world_size": 2},
        {"init_method": "file:///tmp/run/rendezvous", "rank": 1, "world_size": 2},
        {"init_method": "tcp://127.0.0.1:1234", "rank": 0, "world_size": 2},
    ]
    assert joined == [True, True, True]


@pytest.mark.parametrize(
    "waits, straggler",
    [
        ([0.050, 0.002], 1),  # rank 1 waits least: the others wait for it
        ([0.002, 0.050], 0),
        ([0.020, 0.016], None),  # a 4 ms gap: under the 10 % floor of a 60 ms step
        ([0.030, 0.030, 0.001, 0.029], 2),
        ([0.050, 0.002, 0.010], None),  # the others disagree by more than the gap: noise
        ([None, 0.002], None),  # not measured on every rank
    ],
)
def test_the_straggler_rule_either_side_of_its_threshold(waits, straggler):
    ranks = [
        {"rank": r, "step_s": 0.060, "step_spread_s": 0.002, "collective_s": w}
        for r, w in enumerate(waits)
    ]
    s = rules.straggler(ranks)
    assert (None if s is None else s["rank"]) == straggler
    if s is not None:
        assert s["threshold_s"] == pytest.approx(rules.STRAGGLER_FLOOR * 0.060)
        f = rules.straggler_finding(s)
        assert f.kind == "straggler" and f.notebook in rules.NOTEBOOKS.values()


@pytest.mark.parametrize("noisy", ["step_spread_s", "collective_spread_s"])
def test_a_gap_inside_a_ranks_spread_names_no_straggler(noisy):
    """A 20 ms gap on a 60 ms step is past the 10 % floor, but not past a rank whose steps, or
    whose waits, spread by 25 ms: a busy machine, not a straggler."""
    ranks = [
        {"rank": r, "step_s": 0.060, "step_spread_s": 0.001, "collective_s": w}
        for r, w in enumerate([0.025, 0.005])
    ]
    assert rules.straggler(ranks)["rank"] == 1
    ranks[0][noisy] = 0.025
    assert rules.straggler(ranks) is None


def test_collective_time_is_the_union_of_overlapping_spans_step_by_step():
    from helpers.doctor import profiled

    # DDP's buckets overlap (two all-reduces in flight at once): counted once
    assert diagnose.covered_us([(0, 10), (5, 20), (30, 40), (31, 32)]) == 30
    assert diagnose.covered_us([]) == 0
    # three 100 us steps, in collectives 50, 90 (one step a busy machine held up) and 40 us
    m = rules.Measured(device="cpu", step_s=0.010, steps=12)
    spans = [(10, 40), (30, 60), (110, 200), (250, 290)]
    profiled._collectives(spans, [0, 100, 200, 300], m)
    assert m.collective_s == pytest.approx(0.5 * 0.010)  # the median share, of the timed step
    assert m.collective_spread_s > 0
