import json

import pytest

from benchmarks import capstone as bench


def test_benchmark_cpu_mode_writes_table(tmp_path, monkeypatch):
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path))
    rc = bench.main(["--device", "cpu", "--n-train", "64", "--n-test", "32", "--width", "2",
                     "--batch", "16", "--big-batch", "32", "--epochs", "1", "--max-batches", "1",
                     "--no-compile", "--threads", "1", "--accuracy-epochs", "0"])
    assert rc == 0
    md = (tmp_path / "results" / "bench_capstone.md").read_text()
    assert "| reference (d2l) | yes |" in md and "GFLOP per training image" in md
    data = json.loads((tmp_path / "results" / "bench_capstone.json").read_text())
    assert data["bench_table"][0]["ratio"] == 1.0
    assert any(r["note"].startswith("compilation not measured") for r in data["bench_table"])


def test_benchmark_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        bench.parse(["--width", "0"])
    assert "--width must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("ref_acc,fast_acc,rc", [(0.90, 0.95, 0), (0.90, 0.895, 0), (0.90, 0.88, 1)])
def test_benchmark_fails_only_when_the_fast_recipe_loses_accuracy(tmp_path, monkeypatch, ref_acc, fast_acc, rc):
    """Better is fine, half a point worse is fine, two points worse fails the run."""
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path))
    calls = []

    def fake_accuracy(recipe, d, **kw):
        calls.append((recipe, kw["epochs"]))
        return ref_acc if recipe.data == "loader" else fast_acc

    monkeypatch.setattr(bench.capstone, "train_for_accuracy", fake_accuracy)
    got = bench.main(["--device", "cpu", "--n-train", "64", "--n-test", "32", "--width", "2",
                      "--batch", "16", "--big-batch", "32", "--epochs", "1", "--max-batches", "1",
                      "--no-compile", "--threads", "1", "--accuracy-epochs", "3"])
    assert got == rc
    assert [e for _, e in calls] == [3, 3] and calls[0][0].data == "loader" and calls[1][0].data != "loader"
    md = (tmp_path / "results" / "bench_capstone.md").read_text()
    assert f"reference {ref_acc:.4f}, fast {fast_acc:.4f}" in md
