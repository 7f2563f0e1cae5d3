"""The pip requirements and the conda environment must agree on every package and pin."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pins(lines):
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip().lstrip("- ").strip()
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*==\s*([^\s]+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def test_environment_yml_matches_requirements():
    req = _pins((ROOT / "requirements.txt").read_text().splitlines())
    env_lines = (ROOT / "environment.yml").read_text().splitlines()
    pip_section = env_lines[next(i for i, ln in enumerate(env_lines) if ln.strip() == "- pip:"):]
    env = _pins(pip_section)
    assert req, "no pins found in requirements.txt"
    assert req == env, {"only in requirements": req.keys() - env.keys(),
                        "only in environment.yml": env.keys() - req.keys(),
                        "different pins": {k for k in req.keys() & env.keys() if req[k] != env[k]}}


def test_required_pins():
    req = _pins((ROOT / "requirements.txt").read_text().splitlines())
    assert req["torch"] == "2.14.1" and req["torchvision"] == "0.29.1"
    for pkg in ("jupyterlab", "ipywidgets", "matplotlib", "nbval", "pytest", "ruff", "nbstripout"):
        assert pkg in req, pkg
    nodeps = _pins((ROOT / "requirements-nodeps.txt").read_text().splitlines())
    assert nodeps == {"d2l": "1.0.3"}
    assert "requirements-nodeps.txt" in (ROOT / "environment.yml").read_text()
