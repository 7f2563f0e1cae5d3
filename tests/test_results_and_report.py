import json

import matplotlib.pyplot as plt
import pytest

from helpers.suite import report
from helpers.suite.claims import CLAIMS
from helpers.suite.results import Recorder, load_all


def test_recorder_writes_measurements_and_verdicts(tmp_path, capsys):
    record = Recorder("01_test", profile="smoke", directory=tmp_path)
    record.data_source("fashion-mnist", synthetic=True)
    record.measure("uint8 batch", 3.1, "MB", ratio=4.0, note="float32 / uint8")
    assert (
        record.measure("uint8 batch", 3.2, "MB") is None
    )  # replaces, not duplicates; no Out[] echo
    assert record.judge("L3", figure="uint8 copies 3x faster", copy_gain=3.0) == "holds"
    fig, ax = plt.subplots()
    ax.plot([1, 2])
    assert record.figure(fig, "curve") is None  # a cell ending with it prints no file path
    saved = json.loads((tmp_path / "01_test.json").read_text())
    assert [m["value"] for m in saved["measurements"]] == [3.2]
    assert saved["verdicts"][0]["synthetic_data"] is True
    assert saved["verdicts"][0]["measured"] == {"copy_gain": 3.0}
    assert "half the 4x fewer bytes" in saved["verdicts"][0]["rule"]
    assert (tmp_path / "figures" / "01_test__curve.png").exists()
    out = capsys.readouterr().out  # the outcome, its rule in words with each threshold, the figures
    assert "[verdict] L3 - holds: uint8 copies 3x faster" in out
    assert (
        "rule: holds when the float32 copy takes >= 2x" in out
        and ">= 1.1x" in out
        and "copy_gain = 3" in out
    )
    record.judge("L16", figure="strict load fails", prefix_load_failed=True)
    out = capsys.readouterr().out
    assert "[mechanism] L16 - mechanism shown" in out and "demonstrated, not tested" in out
    record.judge("L22", figure="no reference run yet", code_gain=3.0, hardware_gain=None)
    assert "[not decided here] L22 - needs a reference run" in capsys.readouterr().out
    record.judge("L11", figure="a CPU", on_gpu=False, slowdown=1.0)
    assert "[not decided here] L11 - needs a GPU" in capsys.readouterr().out
    assert load_all(tmp_path)[0]["notebook"] == "01_test"


def test_recorder_rejects_bad_input(tmp_path):
    record = Recorder("x", directory=tmp_path)
    with pytest.raises(ValueError, match="unknown claim"):
        record.judge("L99", figure="1")
    with pytest.raises(ValueError, match="measured figure"):
        record.judge("L5", figure="", gain=2.0)
    with pytest.raises(TypeError, match="the rule compares"):
        record.judge("L5", figure="1", speed=2.0)
    with pytest.raises(ValueError, match="NaN"):
        record.measure("x", float("nan"), "s")
    with pytest.raises(ValueError, match="non-empty"):
        Recorder("", directory=tmp_path)


def _two_notebooks(tmp_path):
    res = tmp_path / "results"
    record = Recorder("02_test", profile="smoke", directory=res)
    record.measure("samples/s, in memory", 1234.5, "samples/s", ratio=10.0, note="vs disk")
    record.judge("L4", figure="10x", in_ram_gain=10.0, read_share=0.1)
    fig, ax = plt.subplots()
    ax.bar([0], [1])
    record.figure(fig, "bars")
    other = Recorder("05_test", profile="smoke", directory=res)
    other.judge("L4", figure="1.05x", in_ram_gain=1.05, read_share=0.6)
    other.judge("L9", figure="graph kept", graph_bytes=1e6, after_backward_bytes=10.0)
    other.judge("L7", figure="drop", synthetic=True, worst_mean_drop=0.0, seed_spread=0.0)
    (tmp_path / "run.json").write_text(
        json.dumps({"notebooks": {"02_test": {"status": "ok", "seconds": 3}}})
    )
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# hello *there*")])
    nbformat.write(nb, nbdir / "02_test.ipynb")
    return res


def test_report_shows_every_notebooks_verdict_and_flags_disagreement(tmp_path):
    res = _two_notebooks(tmp_path)
    rep = report.build(load_all(res), references=[])
    ledger = {c["claim"]: c for c in rep["ledger"]}
    assert [(e["notebook"], e["verdict"]) for e in ledger["L4"]["entries"]] == [
        ("02_test", "holds"),
        ("05_test", "does not hold here"),
    ]
    assert ledger["L4"]["disagree"] and not ledger["L7"]["disagree"]
    # a claim meant for two notebooks, recorded by neither: both listed, without a verdict
    assert [e["notebook"] for e in ledger["L18"]["entries"]] == ["notebook 07", "notebook 16"]
    assert ledger["L18"]["entries"][0]["verdict"] == "no verdict recorded"
    assert rep["counts"]["holds"] == 1 and rep["counts"]["does not hold here"] == 1
    assert rep["counts"]["needs the real data set"] == 1
    assert (
        ">= 1.2x the samples/s" in ledger["L4"]["rule"]
    )  # the rule's threshold travels with the verdict
    assert ledger["L18"]["notebooks"] == ["07", "16"]  # from the catalog, the one source
    assert ledger["L9"]["kind"] == "mechanism" and rep["counts"]["mechanism shown"] == 1


def test_report_without_a_catalog_lists_only_recorded_verdicts(tmp_path, monkeypatch):
    """Notebooks run outside the checkout (no notebooks/catalog.toml): the report is still
    written, and names no notebook as missing a verdict."""
    monkeypatch.setattr(report.catalog, "CATALOG", tmp_path / "no-catalog.toml")
    rep = report.build(load_all(_two_notebooks(tmp_path)), references=[])
    ledger = {c["claim"]: c for c in rep["ledger"]}
    assert ledger["L18"]["entries"] == [] and ledger["L18"]["notebooks"] == []
    assert [e["notebook"] for e in ledger["L4"]["entries"]] == ["02_test", "05_test"]


def test_report_files_relative_links_no_markdown_in_html(tmp_path):
    _two_notebooks(tmp_path)
    html_path = report.write(tmp_path)
    md = (tmp_path / "report.md").read_text()
    for cid in CLAIMS:
        assert f"**{cid}**" in md
    assert "(notebooks disagree)" in md and "1,234" in md and "10.00x" in md
    verdicts, mechanisms = md.split("## Claims ledger: verdicts", 1)[1].split("## Mechanisms", 1)
    assert "**L4**" in verdicts and "**L9**" in mechanisms and "**L9**" not in verdicts
    assert (
        "demonstrated, not tested" in mechanisms
        and "measured: in_ram_gain = 10; read_share = 0.1" in verdicts
    )
    assert "](results/figures/02_test__bars.png)" in md  # relative to report.md
    assert "](notebooks/02_test.html)" in md  # the nbconvert copy
    assert str(tmp_path) not in md
    page = html_path.read_text()
    assert "data:image/png;base64," in page and "<table" in page
    assert 'src="http' not in page  # self-contained
    assert "href='notebooks/02_test.html'" in page and "notebooks disagree" in page
    body = page.split("<body>", 1)[1]
    assert "**" not in body and "](" not in body and "\n- " not in body  # no literal Markdown
    rendered = (tmp_path / "notebooks" / "02_test.html").read_text()
    assert "<h1" in rendered and "hello" in rendered  # rendered by nbconvert


def test_report_shows_reference_runs(tmp_path):
    ref_dir = tmp_path / "ref"
    record = Recorder("01_test", profile="full", directory=ref_dir)
    record.measure("samples/s, in memory", 99999, "samples/s")
    record.judge("L4", figure="50x on GPU", in_ram_gain=50.0, read_share=0.5)
    here = Recorder("01_test", profile="smoke", directory=tmp_path / "here")
    here.measure("samples/s, in memory", 1000, "samples/s")
    rep = report.build(load_all(tmp_path / "here"), references=[("h100-2026", load_all(ref_dir))])
    md = report.render(rep, tmp_path)
    assert "99,999 samples/s (h100-2026)" in md
    assert "50x on GPU" in md and "reference (h100-2026)" in md


def test_report_is_written_without_nbconvert(tmp_path, monkeypatch):
    """A GPU node given only the runner's wheels has no nbconvert: the report must still come."""
    import builtins

    real_import = builtins.__import__

    def no_nbconvert(name, *args, **kwargs):
        if name == "nbconvert":
            raise ImportError("No module named 'nbconvert'")
        return real_import(name, *args, **kwargs)

    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_x.ipynb").write_text("{}")
    monkeypatch.setattr(builtins, "__import__", no_nbconvert)
    with pytest.warns(UserWarning, match="nbconvert is not installed"):
        html = report.write(tmp_path)
    assert html.is_file() and (tmp_path / "report.md").is_file()
    assert not (tmp_path / "notebooks" / "01_x.html").exists()


def test_report_leaves_notebooks_unrendered_until_asked(tmp_path):
    """The runner rewrites the report after every notebook without rendering (that would run
    beside the next notebook's measurements), then renders them all at the end."""
    import nbformat

    _two_notebooks(tmp_path)
    executed = tmp_path / "notebooks"
    executed.mkdir(exist_ok=True)
    for name in ("01_a", "02_b"):
        nbformat.write(nbformat.v4.new_notebook(), executed / f"{name}.ipynb")
    report.write(tmp_path, with_notebooks=False)
    assert not list(executed.glob("*.html"))
    report.write(tmp_path)
    assert {p.stem for p in executed.glob("*.html")} == {p.stem for p in executed.glob("*.ipynb")}
