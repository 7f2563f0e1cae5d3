"""The pip requirements and the conda environment must agree on every package and pin."""

import re
import tomllib
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
    pip_section = env_lines[next(i for i, ln in enumerate(env_lines) if ln.strip() == "- pip:") :]
    env = _pins(pip_section)
    assert req, "no pins found in requirements.txt"
    assert req == env, {
        "only in requirements": req.keys() - env.keys(),
        "only in environment.yml": env.keys() - req.keys(),
        "different pins": {k for k in req.keys() & env.keys() if req[k] != env[k]},
    }


def test_required_pins():
    req = _pins((ROOT / "requirements.txt").read_text().splitlines())
    assert req["torch"] == "2.14.1" and req["torchvision"] == "0.29.1"
    for pkg in ("jupyterlab", "ipywidgets", "matplotlib"):
        assert pkg in req, pkg
    dev = _pins((ROOT / "requirements-dev.txt").read_text().splitlines())
    for pkg in ("nbval", "pytest", "ruff", "nbstripout", "playwright"):
        assert pkg in dev and pkg not in req, pkg
    nodeps = _pins((ROOT / "requirements-nodeps.txt").read_text().splitlines())
    assert nodeps == {"d2l": "1.0.3"}
    assert "scripts/install_d2l.py" in (ROOT / "environment.yml").read_text()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _bounds(specs) -> dict:
    out = {}
    for spec in specs:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*>=\s*([^\s,;]+)", spec)
        assert m, f"pyproject dependency without a plain lower bound: {spec!r}"
        out[m.group(1).lower()] = m.group(2)
    return out


def test_lower_bounds_are_the_versions_make_test_compat_installs():
    """Every lower bound in pyproject.toml is tested: requirements-compat.txt pins exactly it."""
    project = _project()
    bounds = _bounds(project["dependencies"]) | _bounds(project["optional-dependencies"]["d2l"])
    compat = _pins(
        ln.replace("===", "==")
        for ln in (ROOT / "requirements-compat.txt").read_text().splitlines()
    )
    req = _pins((ROOT / "requirements.txt").read_text().splitlines())
    extra = {k: v for k, v in compat.items() if k not in bounds}
    assert all(req.get(k) == v for k, v in extra.items()), (
        f"compat lines that are neither bounds nor lock pins: {extra}"
    )
    compat = {k: v for k, v in compat.items() if k in bounds}
    assert bounds == compat, {
        "bound, not tested": bounds.keys() - compat.keys(),
        "tested, not a bound": compat.keys() - bounds.keys(),
        "differ": {
            k: (bounds[k], compat[k])
            for k in bounds.keys() & compat.keys()
            if bounds[k] != compat[k]
        },
    }
    assert {
        "torch",
        "torchvision",
        "numpy",
        "matplotlib",
        "ipywidgets",
        "tqdm",
        "psutil",
    } <= bounds.keys()
    # the exact lock satisfies the bounds
    for name, low in bounds.items():
        if name in req:
            assert _version(req[name]) >= _version(low), (name, req[name], low)


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def test_dev_tools_are_an_extra_not_runtime_dependencies():
    project = _project()
    runtime = set(_bounds(project["dependencies"]))
    assert not {"pytest", "nbval", "ruff", "playwright", "nbstripout", "d2l"} & runtime
    assert set(project["optional-dependencies"]["dev"]) == set(
        _pins((ROOT / "requirements-dev.txt").read_text().splitlines())
    )


def test_import_names_torch_and_the_floor_when_torch_is_older(monkeypatch):
    import warnings
    from importlib import metadata

    import helpers

    floor = _bounds(_project()["dependencies"])["torch"]
    real_version = metadata.version
    for installed, warns in (
        (floor, False),
        (floor + "+cu126", False),
        ("2.10.1", True),
        ("2.99.0", False),
    ):
        monkeypatch.setattr(
            metadata,
            "version",
            lambda name, v=installed: v if name == "torch" else real_version(name),
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            helpers._warn_below_tested_versions()
        lines = [str(w.message) for w in caught]
        assert bool(lines) == warns, (installed, lines)
        if warns:
            assert f"torch {installed} (tested from {floor})" in lines[0]
            assert f"pip install 'torch>={floor}'" in lines[0]
            assert "\n" not in lines[0]


# DALI comes from NVIDIA's own package index for one CUDA version, so no extra can name it;
# helpers/pipelines.py imports it only when present and says how to install it otherwise.
UNDECLARED_ON_PURPOSE = {"nvidia"}


def test_every_package_the_helpers_import_is_declared():
    """A package the helpers import but pyproject.toml does not declare works here by accident
    (another package pulled it in) and fails on a machine where nothing does."""
    import ast
    import sys
    from importlib import metadata

    from packaging.requirements import Requirement

    project = _project()
    specs = project["dependencies"] + sum(project["optional-dependencies"].values(), [])
    declared = {Requirement(s).name.lower().replace("_", "-") for s in specs}
    providers = metadata.packages_distributions()
    undeclared = {}
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names}:
                if top in sys.stdlib_module_names or top in ("helpers", *UNDECLARED_ON_PURPOSE):
                    continue
                dists = {d.lower().replace("_", "-") for d in providers.get(top, [top])}
                if not dists & declared:
                    undeclared.setdefault(top, []).append(path.relative_to(ROOT).as_posix())
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
