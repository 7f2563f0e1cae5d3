import nbformat
import pytest

from helpers import suite


def test_execute_writes_an_executed_copy_and_leaves_the_source(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 6 * 7\nprint(x)")]
    src = tmp_path / "99_tiny.ipynb"
    nbformat.write(nb, src)
    before = src.read_text()
    out = tmp_path / "out"
    out.mkdir()
    res = suite.execute(src, out, timeout=120)
    assert res["status"] == "ok"
    executed = nbformat.read(out / "99_tiny.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"].strip() == "42"
    assert src.read_text() == before


def test_failing_notebook_is_reported(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("raise ValueError('boom')")]
    src = tmp_path / "98_bad.ipynb"
    nbformat.write(nb, src)
    res = suite.execute(src, tmp_path, timeout=120)
    assert res["status"] == "failed" and "boom" in res["error"]


def test_save_reference_copies_results_into_a_device_named_folder(tmp_path, monkeypatch):
    from helpers import paths, results

    monkeypatch.setattr(paths, "reference_results_dir", lambda: tmp_path / "reference")
    res = tmp_path / "results"
    rec = results.Recorder("01_test", profile="full", directory=res)
    rec.measure("samples/s", 5.0, "samples/s")
    rec.data["hardware"] = {"cpu": "Some CPU", "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1}]}
    rec.save()
    target = suite.save_reference(res)
    assert target.parent == tmp_path / "reference"
    assert target.name.endswith("_NVIDIA-H100-80GB-HBM3") and target.name[:4].isdigit()
    saved = results.load_all(target)
    assert [r["notebook"] for r in saved] == ["01_test"] and saved[0]["measurements"][0]["value"] == 5.0
    # the report picks the folder up as a reference run
    from helpers import report

    rep = report.build(results.load_all(res))
    assert [name for name, _ in rep["references"]] == [target.name]


def test_save_reference_refuses_an_empty_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="no result files"):
        suite.save_reference(tmp_path)


def test_reference_run_dir_rejects_a_blank_device_name():
    from helpers import paths

    with pytest.raises(ValueError, match="device_name"):
        paths.reference_run_dir("  ")
    assert paths.reference_run_dir("AMD EPYC", date="2026-01-02").name == "2026-01-02_AMD-EPYC"


def test_executed_copies_carry_the_plots_even_from_a_shell_with_agg(tmp_path, monkeypatch):
    """`make run` draws inline whatever the caller's MPLBACKEND: the copies and the report show plots."""
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")]
    nbformat.write(nb, nbs / "99_plot.ipynb")
    monkeypatch.setattr(suite, "NOTEBOOKS", nbs)
    monkeypatch.setenv("MPLBACKEND", "Agg")  # restored after the test, whatever main() sets
    monkeypatch.setenv("FTG_PROFILE", "smoke")
    assert suite.main(["--profile", "smoke", "--notebooks", "99_*"]) == 0
    (copy,) = (tmp_path / "build").rglob("99_plot.ipynb")
    outputs = nbformat.read(copy, as_version=4).cells[0].outputs
    assert any("image/png" in o.get("data", {}) for o in outputs), [o.output_type for o in outputs]
