import json

import matplotlib.pyplot as plt
import pytest

from helpers import report
from helpers.claims import CLAIMS
from helpers.results import Recorder, load_all


def test_recorder_writes_measurements_and_verdicts(tmp_path, capsys):
    rec = Recorder("01_test", profile="smoke", directory=tmp_path)
    rec.data_source("fashion-mnist", synthetic=True)
    rec.measure("uint8 batch", 3.1, "MB", ratio=4.0, note="float32 / uint8")
    rec.measure("uint8 batch", 3.2, "MB")  # re-measuring replaces, not duplicates
    rec.verdict("L3", "holds", figure="4.0x less memory")
    fig, ax = plt.subplots()
    ax.plot([1, 2])
    rec.figure(fig, "curve")
    saved = json.loads((tmp_path / "01_test.json").read_text())
    assert [m["value"] for m in saved["measurements"]] == [3.2]
    assert saved["verdicts"][0]["synthetic_data"] is True
    assert (tmp_path / "figures" / "01_test__curve.png").exists()
    assert "[verdict] L3 - holds" in capsys.readouterr().out
    assert load_all(tmp_path)[0]["notebook"] == "01_test"


def test_recorder_rejects_bad_input(tmp_path):
    rec = Recorder("x", directory=tmp_path)
    with pytest.raises(ValueError, match="unknown claim"):
        rec.verdict("L99", "holds", figure="1")
    with pytest.raises(ValueError, match="must start with one of"):
        rec.verdict("L1", "probably", figure="1")
    with pytest.raises(ValueError, match="measured figure"):
        rec.verdict("L1", "holds", figure="")
    with pytest.raises(ValueError, match="NaN"):
        rec.measure("x", float("nan"), "s")
    with pytest.raises(ValueError, match="non-empty"):
        Recorder("", directory=tmp_path)


def test_report_has_whole_ledger_measurements_and_inline_plots(tmp_path):
    res = tmp_path / "results"
    rec = Recorder("01_test", profile="smoke", directory=res)
    rec.measure("samples/s, in memory", 1234.5, "samples/s", ratio=10.0, note="vs disk")
    rec.verdict("L4", "holds", figure="10x")
    fig, ax = plt.subplots()
    ax.bar([0], [1])
    rec.figure(fig, "bars")
    (tmp_path / "run.json").write_text(json.dumps({"notebooks": {"01_test": {"status": "ok", "seconds": 3}}}))
    html_path = report.write(tmp_path)
    md = (tmp_path / "report.md").read_text()
    for cid in CLAIMS:
        assert f"| {cid} " in md
    assert "not tested yet" in md and "| L4 " in md and "10x" in md
    ledger = {line.split(" ", 2)[1]: line for line in md.splitlines() if line.startswith("| L")}
    assert "| 01_test | holds |" in ledger["L4"]        # the notebook that recorded the verdict
    assert "| notebook 11 | not tested yet |" in ledger["L20"]  # the one meant to test it
    assert "1,234" in md and "10.00x" in md
    page = html_path.read_text()
    assert "data:image/png;base64," in page and "<table>" in page
    assert 'src="http' not in page  # self-contained


def test_report_shows_reference_runs(tmp_path):
    ref_dir = tmp_path / "ref"
    rec = Recorder("01_test", profile="full", directory=ref_dir)
    rec.measure("samples/s, in memory", 99999, "samples/s")
    rec.verdict("L4", "holds", figure="50x on GPU")
    here = Recorder("01_test", profile="smoke", directory=tmp_path / "here")
    here.measure("samples/s, in memory", 1000, "samples/s")
    rep = report.build(load_all(tmp_path / "here"), references=[("h100-2026", load_all(ref_dir))])
    md = report.to_markdown(rep, tmp_path)
    assert "99,999 samples/s (h100-2026)" in md
    assert "50x on GPU (h100-2026)" in md
