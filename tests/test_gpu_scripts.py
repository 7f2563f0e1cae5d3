"""The scripts of a reference run on an offline GPU node (DEVELOPERS.md, "Reference runs on an
offline GPU node"): the wheel list agrees with our pins and is closed under its requirements, the
run script refuses to start without an output folder (--out) or the wheels, or with a Python or
machine the project and the wheels do not fit (before any pip), takes its step limit as an
argument, and saves, salvages and packs a run's results (checked here without a GPU, on tiny
notebooks, with FTG_ALLOW_NO_GPU=1), `all` through a failure and a kill; the docs name no
particular machine."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
WHEELS_SH = ROOT / "scripts" / "gpu_wheels.sh"
RUN_SH = ROOT / "scripts" / "gpu_reference_run.sh"
WHEELS_TXT = ROOT / "scripts" / "gpu_wheels.txt"
# The GPU node's python3 the wheels are fetched for (Python 3.12 on x86-64 Linux), for markers.
GPU_MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> list[tuple[str, str]]:
    """(normalised name, version) of every `name==version` line, comments and blanks skipped."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
            assert m, f"{path.name}: {line!r} is not name==version"
            out.append((_norm(m[1]), m[2]))
    return out


def test_both_scripts_are_valid_bash():
    for script in (WHEELS_SH, RUN_SH):
        subprocess.run(["bash", "-n", str(script)], check=True)


def test_wheel_list_has_one_version_of_each_and_agrees_with_our_pins():
    pins = _pins(WHEELS_TXT)
    names = [n for n, _ in pins]
    assert len(pins) >= 30, "the closure of nbclient, ipykernel, ipywidgets and d2l is ~35 wheels"
    assert len(set(names)) == len(names), (
        f"duplicates: {sorted({n for n in names if names.count(n) > 1})}"
    )
    ours = dict(_pins(ROOT / "requirements.txt")) | dict(_pins(ROOT / "requirements-nodeps.txt"))
    shared = {n: v for n, v in pins if n in ours}
    assert {"ipykernel", "ipywidgets", "nbclient", "matplotlib-inline", "d2l"} <= shared.keys()
    differ = {n: (v, ours[n]) for n, v in shared.items() if v != ours[n]}
    assert not differ, f"gpu_wheels.txt vs requirements*.txt (name: (gpu, ours)): {differ}"


def test_wheel_list_is_closed_under_its_requirements():
    """Every requirement (as Python 3.12 on Linux sees it) of a listed package is listed too, or
    named on the `already-there:` line (the GPU machine has it). Read from the installed
    packages' metadata where the installed version is the listed one."""
    pins = dict(_pins(WHEELS_TXT))
    there_lines = [
        ln for ln in WHEELS_TXT.read_text().splitlines() if ln.startswith("# already-there:")
    ]
    assert len(there_lines) == 1, "gpu_wheels.txt needs one '# already-there: ...' line"
    there = {_norm(n) for n in there_lines[0].split(":", 1)[1].split()}
    assert not there & pins.keys(), f"both carried and already there: {there & pins.keys()}"
    checked, missing = [], []
    for name, version in pins.items():
        if name == "d2l":  # installed with --no-deps: its 2023 pins are not wanted
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        if dist.version != version:
            continue
        checked.append(name)
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker and not req.marker.evaluate(GPU_MARKERS):
                continue
            if _norm(req.name) not in pins and _norm(req.name) not in there:
                missing.append(f"{name} needs {req}")
    if len(checked) < len(pins) // 2:
        pytest.skip(
            f"only {len(checked)} of {len(pins)} listed packages are installed here at the "
            "listed version; run `make install`"
        )
    assert not missing, "not in gpu_wheels.txt: " + "; ".join(missing)


def _run_script(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 240):
    return subprocess.run(
        ["bash", str(cwd / "scripts" / "gpu_reference_run.sh"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "OUT",
            "PYTHONPATH",
            "FTG_BUILD_DIR",
            "FTG_PYTHON",
            "FTG_SITE",
            "FTG_STEP_SECONDS",
            "FTG_ALLOW_NO_GPU",
        )
    }
    env.update(extra)
    return env


def _script_copy(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(RUN_SH, repo / "scripts" / RUN_SH.name)
    return repo


def _tiny_wheel(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "ftg_tiny-0.1-py3-none-any.whl", "w") as z:
        z.writestr("ftg_tiny/__init__.py", "")
        z.writestr(
            "ftg_tiny-0.1.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: ftg-tiny\nVersion: 0.1\n",
        )
        z.writestr(
            "ftg_tiny-0.1.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr("ftg_tiny-0.1.dist-info/RECORD", "")


def test_run_script_refuses_without_out(tmp_path):
    repo = _script_copy(tmp_path)
    _tiny_wheel(repo / ".whl")
    r = _run_script(["bench"], repo, _clean_env(OUT=str(tmp_path), FTG_SITE=str(tmp_path / "site")))
    assert r.returncode == 2
    assert (
        "no output folder: name one with --out DIR" in r.stderr
    )  # an $OUT in the environment is not used
    assert not (tmp_path / "site").exists()


def test_run_script_checks_its_step_limit_and_creates_the_output_folder(tmp_path):
    repo = _script_copy(tmp_path)
    for bad in ("0", "ten", "-5"):
        r = _run_script(
            ["--out", str(tmp_path / "o"), "--step-seconds", bad, "check"], repo, _clean_env()
        )
        assert r.returncode == 2 and "--step-seconds must be a whole number" in r.stderr, r.stderr
    r = _run_script(
        ["--out", str(tmp_path / "new" / "out"), "--step-seconds", "30", "check"],
        repo,
        _clean_env(),
    )
    assert r.returncode != 0 and ".whl/ holds no wheels" in r.stderr  # got past both options
    assert (tmp_path / "new" / "out").is_dir()
    r = _run_script(["--frobnicate", "check"], repo, _clean_env())
    assert r.returncode == 2 and "unknown option" in r.stderr


def _setting(name: str) -> int:
    return int(re.search(rf"^{name}=(\d+)", RUN_SH.read_text(), re.M)[1])


def test_default_step_limit_fits_a_ten_minute_command():
    """Install + preflight (~30 s, measured on the tiny-notebook runs below: well under) + the
    step + its time to stop + packing must end before 600 s. `all` counts its limit from the
    call's start: the last notebook's stop and the last packing must fit in the rest."""
    default, kill_after = _setting("DEFAULT_STEP_SECONDS"), _setting("KILL_AFTER")
    assert default + kill_after + 30 + 20 <= 600, (default, kill_after)
    assert _setting("ALL_STEP_SECONDS") + kill_after + 30 <= 600
    assert _setting("INSTALL_SECONDS") + _setting("PREFLIGHT_SECONDS") < _setting(
        "ALL_STEP_SECONDS"
    )


def test_run_script_refuses_without_wheels(tmp_path):
    repo = _script_copy(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    for args in (["bench"], ["notebooks", "0[0-4]_*"]):
        r = _run_script(["--out", str(out), *args], repo, _clean_env())
        assert r.returncode != 0
        assert ".whl/ holds no wheels" in r.stderr and "scripts/gpu_wheels.sh" in r.stderr
    assert list(out.iterdir()) == []


def test_run_script_rejects_bad_subcommands(tmp_path):
    repo = _script_copy(tmp_path)
    env = _clean_env()
    for args, msg in (
        (["frobnicate"], "unknown subcommand"),
        ([], "name a subcommand"),
        (["notebooks"], "takes one glob"),
        (["check", "x"], "takes no arguments"),
    ):
        r = _run_script(["--out", str(tmp_path), *args], repo, env)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)
    r = _run_script(["--help"], repo, env)
    assert r.returncode == 0 and "notebooks GLOB" in r.stdout


def test_save_reference_twice_into_one_folder_accumulates(tmp_path, monkeypatch):
    """Separate calls (one glob each) on one GPU on one day save into the same folder."""
    from helpers import paths
    from helpers.suite import results, runner

    monkeypatch.setattr(paths, "reference_results_dir", lambda: tmp_path / "reference")
    gpu = {"cpu": "Some CPU", "gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}
    targets = []
    for call, notebooks in enumerate((["00_a", "01_b"], ["05_c"])):
        res = tmp_path / f"results{call}"  # the suite empties build/results at every start
        for nb in notebooks:
            record = results.Recorder(nb, profile="full", directory=res)
            record.measure("x", float(call), "s")
            record.data["hardware"] = gpu
            record.save()
        targets.append(runner.save_reference(res))
    assert targets[0] == targets[1]
    assert sorted(p.name for p in targets[0].iterdir()) == ["00_a.json", "01_b.json", "05_c.json"]


def _repo_with_tiny_notebooks(
    tmp_path: Path, notebooks: dict[str, str] | None = None, budgets: dict[str, int] | None = None
) -> Path:
    """A copy of the script, the helpers and what the preflight reads, with `notebooks` (name:
    code after recording a measurement) in place of the real ones; with `budgets` (name: H100
    seconds) a catalog.toml that gives `all` its order and limits."""
    repo = _script_copy(tmp_path)
    for folder in ("helpers", "benchmarks"):
        shutil.copytree(ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "requirements.txt", "requirements-nodeps.txt"):
        shutil.copy2(ROOT / name, repo / name)
    (repo / "notebooks").mkdir()
    _tiny_wheel(repo / ".whl")
    record = (
        "from helpers.suite.results import Recorder\n"
        "record = Recorder({name!r}, profile='full')\nrecord.measure('x', 1.5, 's')\n"
    )
    if notebooks is None:
        notebooks = {"96_second": "", "97_ok": "", "98_bad": "raise ValueError('boom')"}
    for name, extra in notebooks.items():
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(record.format(name=name) + extra)]
        nbformat.write(nb, repo / "notebooks" / f"{name}.ipynb")
    if budgets:
        (repo / "notebooks" / "catalog.toml").write_text(
            "".join(
                f'[[notebook]]\nfile = "{n}.ipynb"\nneeds = "cpu"\nclaims = []\n'
                f"budget_seconds_h100 = {b}\n\n"
                for n, b in budgets.items()
            )
        )
    return repo


def _tar_names(out: Path) -> list[str]:
    (tar,) = out.glob("reference-notebooks-*.tar.gz")
    with tarfile.open(tar) as t:
        return sorted(t.getnames())


@pytest.mark.learner  # whole suite runs through the offline-node script: with the hosted-style runs
def test_run_script_saves_salvages_and_packs_without_a_gpu(tmp_path):
    """Call 1: 97 passes, 98 fails, so the suite saves nothing and the script keeps 97's results;
    call 2 (another glob): 96 is saved by the suite into the same folder. Each call packs only
    its own new files; the log, report and run.json come back too."""
    repo = _repo_with_tiny_notebooks(tmp_path)
    env = _clean_env(
        FTG_PYTHON=sys.executable, FTG_SITE=str(tmp_path / "site"), FTG_ALLOW_NO_GPU="1"
    )
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    out1.mkdir()
    out2.mkdir()

    r1 = _run_script(
        ["--out", str(out1), "--step-seconds", "300", "notebooks", "9[78]_*"], repo, env
    )
    assert r1.returncode == 1, r1.stdout + r1.stderr
    assert "preflight ok" in r1.stdout and "kernel ok" in r1.stdout
    assert "finished ok: 97_ok; failed: 98_bad" in r1.stdout
    (folder,) = (repo / "results" / "reference").iterdir()
    names1 = _tar_names(out1)
    assert names1 == [f"results/reference/{folder.name}/97_ok.json"]
    kinds = {p.name.split("-")[0] for p in out1.iterdir()}
    assert kinds == {"notebooks", "reference", "report", "run", "failed"}, kinds
    assert len(list(out1.iterdir())) <= 8
    (log,) = out1.glob("notebooks-*.log")
    assert "NEXT" in log.read_text()

    r2 = _run_script(["--out", str(out2), "notebooks", "96_*"], repo, env)
    assert r2.returncode == 0, r2.stdout + r2.stderr
    assert _tar_names(out2) == [f"results/reference/{folder.name}/96_second.json"]
    assert sorted(p.name for p in folder.iterdir()) == ["96_second.json", "97_ok.json"]
    run = json.loads(next(out2.glob("run-*.json")).read_text())
    assert list(run["notebooks"]) == ["96_second"]


def test_developers_guide_gives_commands_the_script_accepts():
    """The example commands in DEVELOPERS.md name an output folder and a subcommand the script
    has; the capstone benchmark comes first."""
    text = (ROOT / "DEVELOPERS.md").read_text()
    assert "## Reference runs on an offline GPU node" in text
    section = text.split("## Reference runs on an offline GPU node", 1)[1].split("\n## ", 1)[0]
    calls = [
        line.strip()
        for line in section.splitlines()
        if line.strip().startswith("bash scripts/gpu_reference_run.sh --out ")
    ]
    assert len(calls) >= 4
    usage = subprocess.run(
        ["bash", str(RUN_SH), "--help"], capture_output=True, text=True, check=True
    ).stdout
    subs = []
    for call in calls:
        words = call.rstrip("`;").split()[2:]
        while words[0] in ("--out", "--step-seconds"):
            words = words[2:]
        sub = words[0].strip("`;")
        assert sub in ("check", "bench", "notebooks") and sub in usage
        subs.append(sub)
    assert subs.index("bench") < subs.index("notebooks")
    assert "bash scripts/gpu_wheels.sh" in section
    readme = (ROOT / "README.md").read_text()
    assert "scripts/gpu_reference_run.sh --out" in readme


# What would tie the project to one machine or to how a GPU was obtained: an absolute path
# outside the system's own folders (or a /path/to/ placeholder), or words about lending a machine.
_PARTICULAR = re.compile(
    r'(?:^|[\s"\'(=:])/(?!(?:tmp|usr|etc|dev|proc|bin|sys|path)\b)[A-Za-z]\w*/'
    r"|\blent\b|\bdevice tool\b",
    re.IGNORECASE,
)


def test_reference_run_docs_and_scripts_name_no_particular_machine():
    paths = [
        ROOT / "README.md",
        ROOT / "DEVELOPERS.md",
        RUN_SH,
        WHEELS_SH,
        WHEELS_TXT,
        ROOT / "scripts" / "slurm_ddp.sbatch",
    ]
    hits = [
        f"{p.name}:{n}: {line.strip()}"
        for p in paths
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if _PARTICULAR.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_keep_runs_zero_removes_no_run_folder(tmp_path, monkeypatch):
    """`all` starts a suite run per notebook (21 of them): with FTG_KEEP_RUNS=0, which the script
    sets, the 21st does not remove the first; the default still keeps the newest 20."""
    from helpers.suite import runs

    monkeypatch.setenv("FTG_BUILD_DIR", str(tmp_path))
    old = [tmp_path / "runs" / f"2000-01-01_0000{i:02d}" for i in range(25)]
    for d in old:
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"state": "finished"}))
    monkeypatch.setenv("FTG_KEEP_RUNS", "0")
    runs.new_run_dir()
    assert all(d.is_dir() for d in old)
    monkeypatch.setenv("FTG_KEEP_RUNS", "many")
    with pytest.raises(ValueError, match="FTG_KEEP_RUNS must be a whole number"):
        runs.new_run_dir()
    monkeypatch.delenv("FTG_KEEP_RUNS")
    runs.new_run_dir()
    assert sum(d.is_dir() for d in old) == 19  # and the first new one: the newest 20 kept


def test_preflight_rejects_a_python_or_machine_that_does_not_fit_before_pip(tmp_path):
    """A stand-in python3 that answers the version question as told and notes any other call
    (pip): a Python outside requires-python, another system, or wheels fetched for another
    Python or machine stop the call before pip runs, and the private folders are removed."""
    repo = _script_copy(tmp_path)
    shutil.copy2(ROOT / "pyproject.toml", repo / "pyproject.toml")
    _tiny_wheel(repo / ".whl")
    (repo / ".whl" / "ftg_native-1.0-cp312-cp312-manylinux_2_17_x86_64.whl").write_bytes(b"")
    fake, mark = tmp_path / "python3", tmp_path / "pip-ran"
    fake.write_text(
        '#!/bin/sh\n[ "$1" = -c ] && { echo "$FAKE_PY"; exit 0; }\ntouch "$MARK"\nexit 1\n'
    )
    fake.chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for info, message in (
        ("3.10.14 Linux x86_64", "is Python 3.10.14; this project needs Python >=3.11"),
        ("3.12.3 Darwin arm64", "needs Linux on x86_64 or aarch64"),
        ("3.12.3 Linux aarch64", "ftg_native-1.0-cp312-cp312-manylinux_2_17_x86_64.whl (for"),
        ("3.13.1 Linux x86_64", "(for cp312, not cp313)"),
    ):
        env = _clean_env(FTG_PYTHON=str(fake), FAKE_PY=info, MARK=str(mark), TMPDIR=str(tmp))
        r = _run_script(["--out", str(tmp_path / "out"), "check"], repo, env, timeout=60)
        assert r.returncode == 2 and message in r.stdout, (info, r.stdout + r.stderr)
        assert not mark.exists(), f"pip ran for {info}"
        assert list(tmp.iterdir()) == [], "the private folders are removed"
    env = _clean_env(FTG_PYTHON=str(fake), FAKE_PY="3.12.3 Linux x86_64", MARK=str(mark))
    r = _run_script(["--out", str(tmp_path / "out"), "check"], repo, env, timeout=60)
    assert "requires-python >=3.11 met; wheels fit" in r.stdout, r.stdout + r.stderr
    assert mark.exists() and "installing the wheels failed" in r.stdout  # its pip ran


# `all` in a copy with five tiny notebooks. Their H100 budgets give the order: 19 (the capstone's
# number) first whatever its budget, then the longest first; 50's budget never fits the call.
ALL_NOTEBOOKS = {
    "19_first": "",
    "50_huge": "",
    "30_bad": "raise ValueError('boom')",
    "20_after": "",
    "10_hang": "import pathlib, time\npathlib.Path('10_hang.started').touch()\ntime.sleep(600)",
}
ALL_BUDGETS = {"19_first": 5, "50_huge": 5000, "30_bad": 90, "20_after": 80, "10_hang": 70}


def _run_all_until_the_hang_then_sigterm(repo: Path, tmp: Path, out: Path, log: Path) -> int:
    """`gpu_reference_run.sh --out OUT all` in its own process group, SIGTERM to the group once
    the hanging notebook runs; its exit status."""
    env = _clean_env(FTG_PYTHON=sys.executable, FTG_ALLOW_NO_GPU="1", TMPDIR=str(tmp))
    with open(log, "w") as stdout:
        proc = subprocess.Popen(
            ["bash", str(repo / "scripts" / "gpu_reference_run.sh"), "--out", str(out), "all"],
            cwd=repo,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a command runner's
        )
        try:
            deadline = time.monotonic() + 400  # a hang guard: about 2 minutes on 2 busy cores
            # its kernel runs the cell (the marker is in the kernel's folder, notebooks/)
            while not (repo / "notebooks" / "10_hang.started").exists():
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.5)
            os.killpg(proc.pid, signal.SIGTERM)
            return proc.wait(timeout=90)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow  # the preflight's kernel and four suite calls: about a minute (2 on 2 busy cores)
def test_all_goes_on_past_a_failure_and_a_kill_returns_what_finished(tmp_path):
    """The one-call check without a GPU: the failing notebook is recorded with its error and the
    next one runs; SIGTERM to the whole call while the last one runs (what a command limit
    sends) stops it, and what came back holds every finished notebook, nothing half-written;
    the private wheel folder is gone and no run folder was removed, old or new."""
    repo = _repo_with_tiny_notebooks(tmp_path, ALL_NOTEBOOKS, ALL_BUDGETS)
    runs_dir = repo / "build" / "runs"
    old = [runs_dir / f"2000-01-01_0000{i:02d}" for i in range(20)]  # a full build/ already
    for d in old:
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"state": "finished", "notebooks": {}}))
        os.utime(d / "run.json", (0, 0))
    tmp, out = tmp_path / "tmp", tmp_path / "out"
    tmp.mkdir()
    rc = _run_all_until_the_hang_then_sigterm(repo, tmp, out, tmp_path / "stdout")
    text = (tmp_path / "stdout").read_text()
    assert rc == 128 + signal.SIGTERM, text
    for bad in ("KeyError", "Traceback", "packing failed", "report not written"):
        assert bad not in text, text

    seconds = json.loads(next(out.glob("seconds-*.json")).read_text())
    assert seconds["order"] == list(ALL_NOTEBOOKS) and seconds["state"] == "SIGTERM"
    runs = {n: r["runs"][0] for n, r in seconds["notebooks"].items()}
    assert {n: r["status"] for n, r in runs.items()} == {
        "19_first": "ok",
        "30_bad": "failed",
        "20_after": "ok",
        "10_hang": "interrupted",
    }
    assert runs["30_bad"]["error"] == "ValueError: boom" and runs["30_bad"]["tail"]
    assert all(r["beside"] == "alone" and r["seconds"] > 0 for r in runs.values())
    (huge,) = seconds["not_run"]
    assert huge.startswith("50_huge (out of time:"), huge
    with tarfile.open(next(out.glob("reference-*.tar.gz"))) as t:
        assert sorted(t.getnames()) == ["19_first.json", "20_after.json"]
    with tarfile.open(next(out.glob("failed-*.tar.gz"))) as t:
        assert {"30_bad.ipynb", "10_hang.ipynb"} <= set(t.getnames())
    assert "20_after" in next(out.glob("report-*.md")).read_text()
    assert sorted(p.name.split("-")[0] for p in out.iterdir()) == [
        "all",
        "failed",
        "reference",
        "report",
        "seconds",
    ]  # and no half-written file

    site = re.search(r"installing 1 wheels into (\S+)", text)[1]
    assert Path(site).parent == tmp and not Path(site).exists()
    assert not list(tmp.glob("ftg-*")), "the private folders are removed"
    assert all(d.is_dir() for d in old)
    new = [json.loads(p.read_text()) for p in runs_dir.glob("2*/run.json") if p.parent not in old]
    assert sorted(n for r in new for n in r["notebooks"]) == sorted(runs)  # one run each, all kept
