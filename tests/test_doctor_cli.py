"""`python -m helpers.doctor`: runs a script it did not write, stops it after its steps, prints
the same diagnosis as the in-notebook form, and leaves no process behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import psutil
import pytest
import torch

from helpers.doctor import rules
from tests.test_doctor import batched, tiny_ops_net, train

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.doctor  # whole scripts in child processes: `make test-doctor`

TINY_OPS = """
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

torch.set_num_threads(1)
ds = TensorDataset(torch.randn(4096, 16), torch.randint(0, 10, (4096,)))
loader = DataLoader(
    ds, sampler=BatchSampler(RandomSampler(ds), 4, drop_last=True), batch_size=None
)
net = nn.Sequential(
    *[m for _ in range(40) for m in (nn.Linear(16, 16), nn.ReLU())], nn.Linear(16, 10)
)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
print("the script's own output")
for epoch in range(1000):  # far more steps than the doctor needs: it stops the script
    for X, y in loader:
        loss = F.cross_entropy(net(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
print("the script ran to its end")
"""


def doctor(
    tmp_path: Path, source: str, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-m", "helpers.doctor", *args, str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def report(stdout: str) -> dict:
    """A --json report, validated against the schema the package ships (every test's report)."""
    out = json.loads(stdout)
    jsonschema.validate(out, json.loads(rules.SCHEMA_FILE.read_text()))
    assert out["schema"] == rules.SCHEMA
    return out


def _no_leftovers():
    mine = [p for p in psutil.Process().children(recursive=True)]
    assert not mine, f"processes left behind: {mine}"


SPAWNS = """
import multiprocessing as mp
import time

import torch


def train():
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        net(torch.randn(2, 4)).sum().backward()
        opt.step()
    time.sleep(1)


if __name__ == "__main__":
    p = mp.get_context("fork").Process(target=train)
    p.start()
    p.join()
"""


@pytest.mark.timeout(300)
def test_cli_names_the_overhead_bound_script_stops_it_and_agrees_with_the_notebook_form(tmp_path):
    r = doctor(tmp_path, TINY_OPS, "--steps", "14", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "the script ran to its end" not in r.stdout
    assert (tmp_path / "train.py").read_text() == textwrap.dedent(TINY_OPS)  # never modified
    out = report(r.stdout)  # the JSON alone: the script's print went to stderr
    assert "the script's own output" in r.stderr
    # torch.profiler's C++ lines (Kineto's start/stop, its GPU probe's ERROR on a CPU) stay out
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith(("USDT:", "ERROR:", "STAGE:"))]
    assert out["findings"][0]["kind"] == "overhead-bound"
    assert out["measured"]["steps"] <= 14
    _no_leftovers()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # the same loop in the notebook form: the same diagnosis
        w = train(batched(4096, 16, 4), tiny_ops_net(), timed=4, what_if=False)
    finally:
        torch.set_num_threads(before)
    assert w.findings[0].kind == out["findings"][0]["kind"]


NOISY = """
import sys

import torch

net = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
print("ERROR: the script's own error line", file=sys.stderr)
print("W1128 10:41:32.766000 26419 fake/runtime.py:1] a runtime log line", file=sys.stderr)
for _ in range(40):
    net(torch.randn(16, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.timeout(300)
def test_runtime_log_lines_are_hidden_and_counted_the_scripts_own_are_kept(tmp_path):
    r = doctor(tmp_path, NOISY, "--steps", "14")
    assert r.returncode in (0, 4), r.stderr[-2000:]
    assert "ERROR: the script's own error line" in r.stderr
    assert "a runtime log line" not in r.stderr + r.stdout
    assert re.search(r"\b[1-9]\d* log lines? of PyTorch's runtime .* hidden", r.stdout), r.stdout
    _no_leftovers()


@pytest.mark.timeout(120)
def test_cli_says_what_it_cannot_see_in_processes_the_script_starts(tmp_path):
    r = doctor(tmp_path, SPAWNS)
    assert r.returncode == 2 and "started processes of its own" in r.stderr, r.stderr[-2000:]
    _no_leftovers()


@pytest.mark.timeout(120)
def test_cli_says_when_there_is_no_optimizer_step(tmp_path):
    r = doctor(tmp_path, "import torch\nprint(torch.ones(2).sum())\n")
    assert r.returncode == 2 and "no optimizer step seen" in r.stderr


@pytest.mark.timeout(120)
def test_cli_says_when_the_script_fails(tmp_path):
    r = doctor(tmp_path, "raise ValueError('broken on purpose')\n")
    assert r.returncode == 2 and "the script failed: ValueError: broken on purpose" in r.stderr
    r = doctor(tmp_path, "raise ValueError('broken on purpose')\n", "--json")
    assert r.returncode == 2 and "broken on purpose" in report(r.stdout)["error"]
    _no_leftovers()


@pytest.mark.timeout(120)
def test_cli_ends_a_hanging_script_at_the_timeout(tmp_path):
    r = doctor(tmp_path, "import time\nwhile True:\n    time.sleep(0.1)\n", "--timeout", "3")
    assert r.returncode == 3 and "ran past --timeout 3 s" in r.stderr
    _no_leftovers()


def test_cli_refuses_bad_options(tmp_path):
    r = doctor(tmp_path, "pass\n", "--steps", "3")
    assert r.returncode == 2 and "--steps must be an int >= 12, got 3" in r.stderr


# An L-BFGS loop (each step(closure) runs several forward/backward passes) that ends after
# `STEPS` optimizer steps: fewer than the doctor's windows need.
SHORT_LBFGS = """
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(8, 8), nn.Tanh())])
opt = torch.optim.LBFGS(net.parameters(), max_iter=5)
X, y = torch.randn(64, 8), torch.randn(64, 8)


def closure():
    opt.zero_grad()
    loss = nn.functional.mse_loss(net(X), y)
    loss.backward()
    return loss


for _ in range(STEPS):
    opt.step(closure)
print("the script ran to its end")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("steps", [6, 3])
def test_a_loop_that_ends_before_the_windows_fill_gets_no_all_clear(tmp_path, steps):
    """6 steps fill the warm-up and timed windows (2 + 3 with --steps 14), not the profiled and
    counted ones; 3 steps not even the timed one. Either way: status 4, no verdict."""
    r = doctor(tmp_path, SHORT_LBFGS.replace("STEPS", str(steps)), "--steps", "14")
    assert r.returncode == 4, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    if steps == 3:  # the error form of the report says inconclusive too
        j = doctor(tmp_path, SHORT_LBFGS.replace("STEPS", "3"), "--steps", "14", "--json")
        assert j.returncode == 4 and report(j.stdout)["inconclusive"] is True
    said = r.stdout + r.stderr
    assert "nothing to fix" not in said and "device-bound" not in said and "Verdict:" not in said
    assert "--steps" in said and "--timeout" in said  # how to get a diagnosis
    if steps == 6:
        assert f"the loop took {steps} optimizer steps of the 9" in r.stdout
        assert "not measured: the profiled window" in r.stdout
        assert "the counted window" in r.stdout
    else:
        assert "inconclusive: the doctor saw 3 optimizer steps" in r.stderr
    _no_leftovers()


@pytest.mark.timeout(120)
def test_the_json_report_says_inconclusive(tmp_path):
    r = doctor(tmp_path, SHORT_LBFGS.replace("STEPS", "6"), "--steps", "14", "--json")
    assert r.returncode == 4, r.stderr[-2000:]
    out = report(r.stdout)
    assert out["inconclusive"] is True and out["measured"]["steps_needed"] == 9
    assert out["measured"]["not_measured"] and not rules.DEVICE_BOUND & {
        f["kind"] for f in out["findings"]
    }
    assert out["verdict"]["kind"] == "inconclusive"


@pytest.mark.timeout(180)
def test_syncs_inside_lbfgs_are_blamed_on_lbfgs_not_the_users_loop(tmp_path):
    r = doctor(tmp_path, SHORT_LBFGS.replace("STEPS", "40"), "--steps", "14", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    out = report(r.stdout)
    (sync,) = [f for f in out["findings"] if f["kind"] == "sync-bound"]
    line = next(
        i + 1
        for i, text in enumerate(textwrap.dedent(SHORT_LBFGS).splitlines())
        if "opt.step(closure)" in text
    )
    assert (
        f"none in your code: inside torch.optim.lbfgs (called from train.py:{line})"
        in (sync["evidence"])
    )
    assert "loss.detach()" not in sync["fix"] and "how you call it" in sync["fix"]
    assert {s["library"] for s in out["measured"]["sync_sites"]} == {"torch.optim.lbfgs"}


INPUT_BOUND = """
import time

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)


class Slow(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(0.004)  # a slow read: the loop waits for it
        return torch.randn(16), i % 10


net = torch.nn.Linear(16, 10)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for X, y in DataLoader(Slow(), batch_size=8):
    loss = F.cross_entropy(net(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


OVERSUBSCRIBED = """
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(2)  # both cores for the model, and two busy workers beside it


class Made(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):  # each sample made on the CPU, as decoding and augmenting do
        x = torch.randn(96, 96, generator=torch.Generator().manual_seed(i))
        for _ in range(4):
            x = torch.tanh(x @ x / 96)
        return x.flatten()[:512], i % 10


net = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for X, y in DataLoader(Made(), batch_size=64, num_workers=2, persistent_workers=True):
    loss = F.cross_entropy(net(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.timeout(240)
def test_what_if_reruns_the_script_with_workers_only_when_asked(tmp_path):
    r = doctor(tmp_path, INPUT_BOUND, "--steps", "14", "--what-if", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    out = report(r.stdout)
    assert out["findings"][0]["kind"] == "input-bound"
    assert "not run" in out["what_if"]["text"] and "--what-if-loader" in out["what_if"]["text"]
    r = doctor(tmp_path, INPUT_BOUND, "--steps", "14", "--what-if-loader")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "What-if for input-bound, re-run with every DataLoader built with num_workers=" in (
        r.stdout
    )
    assert "(in the doctor's child only)" in r.stdout and "predicted " in r.stdout
    assert "it helps" in r.stdout  # 8 sleeping reads per step, now in workers
    assert (tmp_path / "train.py").read_text() == textwrap.dedent(INPUT_BOUND)  # never modified
    _no_leftovers()


def test_what_if_says_plainly_when_it_does_not_help():
    from helpers.doctor import whatif

    record = {"finding": "oversubscribed-threads", "change": "torch.set_num_threads(1)"}
    record |= {"predicted_speedup": 1.4, "measured_speedup": 0.97}
    record |= {"step_s_before": 0.010, "step_s_after": 0.0103}
    text = whatif.render(record)
    assert "predicted 1.40x, measured 0.97x" in text and "it does not help here" in text


def test_a_finding_a_rerun_cannot_fix_is_not_rerun():
    from helpers.doctor import whatif

    change, why = whatif.change_for({"kind": "overhead-bound"}, {"cores": 2}, loader=True)
    assert change is None and "doctor.watch" in why
