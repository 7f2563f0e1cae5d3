"""Shared fixtures: every test gets its own data and build folders and no network."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("FTG_OFFLINE", "1")
    monkeypatch.delenv("FTG_RESULTS_DIR", raising=False)  # results go to the test's build folder
    yield


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    root = tmp_path / "data"
    monkeypatch.setenv("FTG_DATA_DIR", str(root))
    return root
