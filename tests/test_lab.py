"""`make lab`'s JupyterLab: loopback, no news, root allowed only as root, no backend forced."""

import json
import os
import re

from helpers import paths
from helpers.suite import lab


def test_lab_command_is_loopback_without_news_and_allows_root_only_as_root(tmp_path):
    cmd = lab.command(tmp_path, ["--no-browser"])
    assert "--ServerApp.ip=127.0.0.1" in cmd and "--LabApp.news_url=None" in cmd
    assert ("--allow-root" in cmd) == (os.geteuid() == 0)
    assert cmd[-1] == "--no-browser" and str(tmp_path) in cmd
    assert not any("token" in a.lower() for a in cmd), "the token must stay JupyterLab's own"


def test_lab_environment_adds_the_settings_and_keeps_the_rest():
    env = lab.environment({"JUPYTER_CONFIG_PATH": "/somewhere", "KEEP": "1"})
    assert env["JUPYTER_CONFIG_PATH"].split(os.pathsep) == [str(lab.CONFIG_DIR), "/somewhere"]
    assert env["KEEP"] == "1" and "MPLBACKEND" not in env
    assert env["KINETO_LOG_LEVEL"] == "6"  # the kernels inherit it: no profiler log lines
    assert lab.environment({"KINETO_LOG_LEVEL": "1"})["KINETO_LOG_LEVEL"] == "1"  # asked for
    overrides = json.loads(
        (lab.CONFIG_DIR / "labconfig" / "default_setting_overrides.json").read_text()
    )
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"


def test_makefile_sets_no_matplotlib_backend_for_jupyter():
    text = (paths.ROOT / "Makefile").read_text()
    assert not re.search(r"^export\s+MPLBACKEND", text, re.M), (
        "a Jupyter started by make would draw no plots"
    )
    recipe = re.search(r"^lab:.*\n((?:\t.*\n)+)", text, re.M).group(1)
    assert "helpers.suite.lab" in recipe and "MPLBACKEND" not in recipe
