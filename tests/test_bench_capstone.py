import json

from benchmarks import capstone as bench


def test_benchmark_cpu_mode_writes_table(tmp_path, monkeypatch):
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path))
    rc = bench.main(["--device", "cpu", "--n-train", "64", "--n-test", "32", "--width", "2",
                     "--batch", "16", "--big-batch", "32", "--epochs", "1", "--max-batches", "1",
                     "--no-compile", "--threads", "1"])
    assert rc == 0
    md = (tmp_path / "results" / "bench_capstone.md").read_text()
    assert "| reference (d2l) | yes |" in md and "GFLOP per training image" in md
    data = json.loads((tmp_path / "results" / "bench_capstone.json").read_text())
    assert data["bench_table"][0]["ratio"] == 1.0
    assert any(r["note"].startswith("compilation not measured") for r in data["bench_table"])


def test_benchmark_rejects_bad_arguments(capsys):
    import pytest

    with pytest.raises(SystemExit):
        bench.parse(["--width", "0"])
    assert "--width must be >= 1" in capsys.readouterr().err
