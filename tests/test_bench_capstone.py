"""`make bench` executes notebook 19 (the one source of the capstone's code) and turns what it
recorded into a table. These tests run its plumbing around a faked execution; the real run is
`make bench` itself and benchmarks/test_capstone_ratio.py."""

import json

import nbformat
import pytest

from benchmarks import capstone as bench

ROWS = [  # what notebook 19 records in record.data["waterfall"]
    {
        "step": "reference (d2l)",
        "kept": True,
        "s / epoch": 4.0,
        "spread s": 0.1,
        "samples/s": 1024.0,
        "x reference": 1.0,
        "device busy %": 50.0,
        "note": "the book's loop",
        "cuda graphs used": None,
        "% of peak": None,
        "peak precision": "tf32",
    },
    {
        "step": "uint8 in memory",
        "kept": True,
        "s / epoch": 2.0,
        "spread s": 0.1,
        "samples/s": 2048.0,
        "x reference": 2.0,
        "device busy %": 90.0,
        "note": "no workers",
        "cuda graphs used": None,
        "% of peak": None,
        "peak precision": "tf32",
    },
    {
        "step": "torch.compile",
        "kept": False,
        "s / epoch": None,
        "spread s": None,
        "samples/s": None,
        "x reference": None,
        "device busy %": None,
        "note": "skipped in this profile",
        "cuda graphs used": None,
        "% of peak": None,
        "peak precision": "tf32",
    },
]


def _fake_execute(status="ok", error=""):
    def execute(nb_path, out_dir, timeout):
        nb = nbformat.read(nb_path, as_version=4)
        execute.sources = [c.source for c in nb.cells]
        recorded = {
            "waterfall": ROWS,
            "gflop_per_image": 0.012,
            "fp32_defaults": {"matmuls": "none", "convolutions": "tf32"},
            "data_sources": {
                "fashion-mnist": {"synthetic": True, "detail": "4096 train / 2000 test"}
            },
            "measurements": [
                {"name": "reference test accuracy", "value": 0.80},
                {"name": "fast recipe test accuracy", "value": 0.81},
            ],
        }
        (out_dir / "19_capstone.json").write_text(json.dumps(recorded))
        return {"status": status, "seconds": 1.0, "error": error}

    return execute


def test_benchmark_writes_the_notebooks_table(tmp_path, monkeypatch):
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path))
    fake = _fake_execute()
    monkeypatch.setattr(bench.runner, "execute", fake)
    assert bench.main(["--profile", "smoke", "--set", "WIDTH=16", "--accuracy-epochs", "2"]) == 0
    md = (tmp_path / "results" / "bench_capstone.md").read_text()
    assert "| reference (d2l) | yes | 4.000 |" in md and "| uint8 in memory | yes | 2.000 |" in md
    assert (
        "0.012 GFLOP per training image" in md and "reference 0.8000, fast 0.8100 (+1.00 pp)" in md
    )
    assert (
        "- fp32 precision: the reference keeps PyTorch's defaults, matmuls 'none' "
        "('none': inherited 'ieee'), convolutions 'tf32'" in md
    )
    data = json.loads((tmp_path / "results" / "bench_capstone.json").read_text())
    assert [r["ratio"] for r in data["bench_table"]] == [1.0, 2.0, None]
    assert data["bench_table"][2]["note"] == "skipped in this profile"
    # the overrides went in right after the notebook's parameters cell
    i = next(i for i, s in enumerate(fake.sources) if "profile = profiles.active()" in s)
    assert "WIDTH=16\nACC_EPOCHS=2" in fake.sources[i + 1]


@pytest.mark.parametrize("profile,reference", [("smoke", False), ("gpu", True), ("full", True)])
def test_only_a_gpu_or_full_run_on_a_gpu_is_a_reference(tmp_path, monkeypatch, profile, reference):
    """On a CUDA GPU the gpu profile (epochs sized by time) and the full one are written to the
    reference folder, a smoke run is not; every table and record names its profile."""
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(bench.runner, "execute", _fake_execute())
    monkeypatch.setattr(bench.devices, "accelerator", lambda: "cuda")
    ref_dir = tmp_path / "reference"
    assert bench.main(["--profile", profile, "--reference-dir", str(ref_dir)]) == 0
    assert (ref_dir / "bench_capstone.md").exists() is reference
    md = (tmp_path / "results" / "bench_capstone.md").read_text()
    assert md.startswith("# Capstone benchmark: ") and f", {profile} profile\n" in md
    data = json.loads((tmp_path / "results" / "bench_capstone.json").read_text())
    assert data["profile"] == profile


def test_a_failing_notebook_fails_the_benchmark(tmp_path, monkeypatch, capsys):
    """The notebook asserts the accuracy: when it fails, so does `make bench` (exit status 1)."""
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(
        bench.runner,
        "execute",
        _fake_execute(
            "failed",
            "AssertionError: the fast recipe lost accuracy: -2.00 pp (more than one point)",
        ),
    )
    assert bench.main([]) == 1
    assert (
        "FAIL: notebook 19 failed: AssertionError: the fast recipe lost accuracy"
        in capsys.readouterr().out
    )
    assert not (tmp_path / "results" / "bench_capstone.md").exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--set", "width=4"], "--set takes NAME=VALUE"),
        (["--set", "WIDTH"], "--set takes NAME=VALUE"),
        (["--accuracy-epochs", "0"], "--accuracy-epochs must be >= 1"),
        (["--profile", "huge"], "invalid choice"),
    ],
)
def test_benchmark_rejects_bad_arguments(capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.parse(argv)
    assert message in capsys.readouterr().err


def test_capstone_has_the_parameters_cell_the_benchmark_overrides():
    """Papermill's convention: the override cell, tagged injected-parameters, right after the one
    tagged parameters."""
    nb = bench.notebook_with(["EPOCHS=3"])
    (i,) = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    for name in ("N_TRAIN", "WIDTH", "BATCH", "BIG_BATCH", "EPOCHS", "ACC_EPOCHS", "COMPILE"):
        assert f"{name} = profile.pick(" in nb.cells[i].source
    assert nb.cells[i + 1].metadata["tags"] == ["injected-parameters"]
    assert nb.cells[i + 1].source.splitlines()[0] == "EPOCHS=3"
