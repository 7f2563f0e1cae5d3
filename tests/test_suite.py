import nbformat

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
