"""The doctor on a corpus of training scripts in the styles users write (tests/doctor_corpus/),
run unmodified from the command line. Each script's docstring says what the doctor must find:
`expect: <kind>` for the top finding, `a|b` where either is honest on the machine in hand
(`device-bound`: on either side of its ceiling; `device-bound, below its ceiling`: that side),
`inconclusive` for exit status 4, `any` where only a clean diagnosis is asked; `finds: <kind>`
lines, findings the report must have besides; `unseen: <text>` lines, what the report must say
it could not see; `needs: cuda`, a script that runs only where a CUDA GPU is (skipped elsewhere,
with the reason). An input-bound script is re-run with workers (--what-if-loader): its
prediction, made from the first run alone, lands within `whatif.PREDICTION_BAND` of the re-run's
measured speed-up, or says beforehand that it cannot be predicted here (and why). Every report
validates against the shipped schema, no script is edited, and no process is left behind.
`make test-doctor` runs it, two scripts at a time (about three minutes on 2 cores: the
input-bound scripts run twice)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from helpers.doctor import rules, whatif
from tests.test_doctor_cli import ROOT, report

pytestmark = pytest.mark.doctor
CORPUS = sorted((ROOT / "tests" / "doctor_corpus").glob("*.py"))


def expected(script: Path) -> str:
    (kind,) = re.findall(r"^expect: (.+)$", script.read_text(), flags=re.M)
    return kind.strip()


def test_the_corpus_covers_the_patterns_users_write():
    assert len(CORPUS) >= 8
    kinds = {k for s in CORPUS for k in expected(s).split("|")}
    assert {"input-bound", "sync-bound", "overhead-bound", "inconclusive"} <= kinds


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", CORPUS, ids=[s.stem for s in CORPUS])
def test_the_doctor_finds_what_each_script_has(script):
    before = script.read_text()
    if (
        "cuda" in re.findall(r"^needs: (\S+)$", before, flags=re.M)
        and not torch.cuda.is_available()
    ):
        pytest.skip(
            f"{script.name} needs a CUDA GPU (needs: cuda) and torch sees none here; on a CPU "
            "the doctor lists what it shows under 'not seen here'"
        )
    want = expected(script)
    rerun = ["--what-if-loader"] * ("input-bound" in want.split("|"))
    done = subprocess.run(
        [sys.executable, "-m", "helpers.doctor", "--json", *rerun, str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = report(done.stdout)
    if want == "inconclusive":
        assert done.returncode == 4 and out["inconclusive"] is True, done.stderr[-2000:]
    else:
        assert done.returncode == 0, (out, done.stderr[-2000:])
        if want != "any":  # one kind, or several separated by | where the machine decides
            kind = out["findings"][0]["kind"]
            bound = "device-bound" if kind in rules.DEVICE_BOUND else kind  # near or below
            assert {kind, bound} & set(want.split("|")), [
                (f["kind"], f["evidence"]) for f in out["findings"]
            ]
    for kind in re.findall(r"^finds: (\S+)$", before, flags=re.M):
        assert kind in [f["kind"] for f in out.get("findings", [])], out.get("findings")
    if rerun and out["findings"][0]["kind"] == "input-bound":
        priced_first(out["what_if"])
    for text in re.findall(r"^unseen: (.+)$", before, flags=re.M):
        assert any(text in u for u in out["measured"]["unseen"]), out["measured"]["unseen"]
    assert "global hooks" not in done.stderr  # the doctor's own instruments warn nothing
    assert script.read_text() == before  # never edited
    assert not psutil.Process().children(recursive=True), "processes left behind"


def priced_first(w: dict) -> None:
    """A workers what-if: predicted near what the re-run measured, or said beforehand that it
    cannot be predicted here, with the reason."""
    predicted, measured = w.get("predicted_speedup"), w.get("measured_speedup")
    assert measured is not None, w["text"]
    if predicted is None:
        assert w["prediction"].startswith("cannot be predicted here: "), w["text"]
    else:
        assert whatif.held_up(predicted, measured), w["text"]
