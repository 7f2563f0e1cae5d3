#!/usr/bin/env bash
# The GPU reference run on an offline GPU node (a cluster's compute node without internet, a
# cloud GPU box, a workstation): what `make reference` does, in steps that each fit a command
# of 10 minutes. Run it THERE, in a copy of this repository with .whl/ beside the scripts
# (fetch the wheels on a machine with internet first: bash scripts/gpu_wheels.sh).
#
#     bash scripts/gpu_reference_run.sh --out DIR all                 # the one-call GPU check
#     bash scripts/gpu_reference_run.sh --out DIR check               # preflight only (~30 s)
#     bash scripts/gpu_reference_run.sh --out DIR bench [ARGS]        # python3 -m benchmarks.capstone ARGS
#     bash scripts/gpu_reference_run.sh --out DIR notebooks '0[0-4]_*'   # suite, full profile, --save-reference
#
# Options (before the subcommand):
#     --out DIR            folder for everything to bring back (required; created if missing)
#     --step-seconds N     time limit of the step (default 510: with ~30 s of install and
#                          preflight, up to 20 s to stop a step and a few to pack, a call ends
#                          within a 10-minute limit; raise it where commands may run longer;
#                          `all` defaults to 300, so its call ends within 6 minutes)
#
# `all` is the one-call check of a GPU: the preflight, then every notebook in the default `gpu`
# profile (FTG_STREAMS notebooks at a time, default 3 on 8 or more cores, else 1; each notebook
# runs alone in its own suite call, so one that fails or hangs costs only itself), the capstone
# benchmark's table taken from notebook 18's run, all packed as it goes into at most 8 files:
#     all-<time>.log, seconds-<time>.json (each notebook's status, seconds, stream and device),
#     report-<time>.md, bench_capstone-<time>.md, failed-<time>.tar.gz (executed copies of the
#     failures), reference-<time>.tar.gz (the passing notebooks' results for results/reference/)
#
# Every subcommand installs .whl/*.whl into a private folder, checks that the kernel starts and
# sees the GPU, runs its step under the time limit, and leaves in DIR:
#     <sub>-<time>.log                 everything printed (written as it runs: it is there
#                                      even when the command is killed)
#     reference-<sub>-<time>.tar.gz    the files this call added under results/reference/
#     report-<sub>-<time>.md, run-<sub>-<time>.json   the suite's report and per-notebook times
#     failed-<sub>-<time>.tar.gz       executed copies of notebooks that failed, if any
# Settings (environment): FTG_PYTHON (default python3), FTG_SITE (where the wheels are installed,
# default a new private folder from `mktemp -d`), FTG_STREAMS (`all`), FTG_ALLOW_NO_GPU=1 (run
# without a GPU: only for this script's own
# tests, tests/test_gpu_scripts.py; a reference run needs the GPU).
# DEVELOPERS.md, "Reference runs on an offline GPU node", has the whole procedure.
set -euo pipefail

PROG=gpu_reference_run.sh
PY=${FTG_PYTHON:-python3}
SITE=${FTG_SITE:-}  # empty: a private folder made by mktemp -d once the arguments are read
DEFAULT_STEP_SECONDS=510
ALL_STEP_SECONDS=300

usage() {
    cat <<'EOF'
usage: bash scripts/gpu_reference_run.sh --out DIR [--step-seconds N] all | check | bench [ARGS] | notebooks GLOB
  --out DIR          folder for the log and the packed results (required)
  --step-seconds N   time limit of the step (default 510, `all` 300: a call then ends within 10
                     minutes, `all` within 6)
  all                the one-call check: preflight, every notebook in the gpu profile
                     (FTG_STREAMS at a time), the capstone's table, packed into at most 8 files
  check              install the wheels in .whl/, start a kernel, show the GPU; nothing else
  bench [ARGS]       the capstone benchmark (python3 -m benchmarks.capstone ARGS), e.g.
                     bench --accuracy-epochs 3 if the defaults overrun the limit
  notebooks GLOB     python3 -m helpers.suite --profile full --yes --notebooks GLOB --save-reference
                     the notebooks in four calls: '0[0-4]_*', '0[5-9]_*', '1[0-4]_*', '1[5-8]_*'
Runs on the GPU node, offline; needs .whl/ (bash scripts/gpu_wheels.sh on a machine with internet).
EOF
}
die() { echo "$PROG: ERROR: $*" >&2; exit 2; }

OUT_DIR=""
STEP_SECONDS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || die "--out needs a folder"; OUT_DIR=$2; shift 2 ;;
        --out=*) OUT_DIR=${1#--out=}; shift ;;
        --step-seconds) [ $# -ge 2 ] || die "--step-seconds needs a number"; STEP_SECONDS=$2; shift 2 ;;
        --step-seconds=*) STEP_SECONDS=${1#--step-seconds=}; shift ;;
        -h | --help | help) usage; exit 0 ;;
        -*) usage >&2; die "unknown option '$1'" ;;
        *) break ;;
    esac
done

SUB=${1:-}
case "$SUB" in
    all) [ $# -eq 1 ] || die "'all' takes no arguments (FTG_STREAMS sets how many at a time)" ;;
    check) [ $# -eq 1 ] || die "'check' takes no arguments" ;;
    bench) ;;  # any further arguments go to benchmarks.capstone (--help lists them)
    notebooks) [ $# -eq 2 ] && [ -n "$2" ] \
        || die "'notebooks' takes one glob of notebook names, e.g. notebooks '0[0-4]_*'" ;;
    "") usage >&2; die "name a subcommand: all, check, bench or notebooks GLOB" ;;
    *) usage >&2; die "unknown subcommand '$SUB': use all, check, bench or notebooks GLOB" ;;
esac
if [ -z "$STEP_SECONDS" ]; then
    if [ "$SUB" = all ]; then STEP_SECONDS=$ALL_STEP_SECONDS; else STEP_SECONDS=$DEFAULT_STEP_SECONDS; fi
fi
GLOB=${2:-}
BENCH_ARGS=("${@:2}")
[[ $STEP_SECONDS =~ ^[1-9][0-9]*$ ]] || die "--step-seconds must be a whole number of seconds, got '$STEP_SECONDS'"
[ -n "$OUT_DIR" ] || die "no output folder: name one with --out DIR (the log and the packed \
results are written there). On the machine with internet run 'bash scripts/gpu_wheels.sh' \
first (DEVELOPERS.md, 'Reference runs on an offline GPU node')."
mkdir -p "$OUT_DIR" 2>/dev/null || die "--out $OUT_DIR: cannot create that folder"
[ -w "$OUT_DIR" ] || die "--out $OUT_DIR is not a writable folder"
OUT=$(cd "$OUT_DIR" && pwd)

cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${FTG_BUILD_DIR:-$ROOT/build}  # where helpers.suite writes (helpers/paths.py)
compgen -G ".whl/*.whl" >/dev/null || die ".whl/ holds no wheels in $ROOT. Run \
'bash scripts/gpu_wheels.sh' on a machine with internet, then copy .whl/ here with the repository."
command -v "$PY" >/dev/null || die "no $PY on this machine (FTG_PYTHON names another)"

[ -n "$SITE" ] || SITE=$(mktemp -d "${TMPDIR:-/tmp}/ftg-site.XXXXXX")  # ours alone: no fixed path
TAG="$SUB-$(date -u +%H%M%S)"
LOG="$OUT/$TAG.log"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
STAMP=$(mktemp)
finish() {
    local rc=$?
    rm -f "$STAMP"
    exec 1>&- 2>&-
    wait "$TEE_PID" 2>/dev/null || true
    exit "$rc"
}
trap finish EXIT

export PYTHONUNBUFFERED=1
export FTG_OFFLINE=${FTG_OFFLINE:-1}  # the machine reaches nothing: skip download attempts
echo "== $PROG $* on $(hostname) at $(date -u '+%Y-%m-%d %H:%M:%S') UTC, step limit ${STEP_SECONDS} s"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
    || echo "(no nvidia-smi here)"
echo "== installing $(compgen -G '.whl/*.whl' | wc -l) wheels into $SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"

# Preflight (about 10-30 s): the imports the suite needs, the carried wheels' requirements met
# by what the machine has, a python3 kernel that starts and imports ipywidgets, and the GPU.
echo "== preflight"
NEED_GPU=1
if [ "$SUB" = check ] || [ "${FTG_ALLOW_NO_GPU:-0}" = 1 ]; then NEED_GPU=0; fi
FTG_SITE="$SITE" FTG_NEED_GPU=$NEED_GPU "$PY" - <<'PYEOF'
import importlib, importlib.metadata as md, importlib.util, os, sys

site, need_gpu = os.environ["FTG_SITE"], os.environ["FTG_NEED_GPU"] == "1"
print(f"python {sys.version.split()[0]} at {sys.executable}")
failed = []
for mod in ("nbclient", "nbformat", "jupyter_client", "ipykernel", "ipywidgets",
            "matplotlib_inline", "IPython", "d2l"):
    try:
        m = importlib.import_module(mod)
        print(f"  {mod:18} {getattr(m, '__version__', '')!s:10} {os.path.dirname(m.__file__)}")
    except Exception as e:  # noqa: BLE001 - report every missing piece, then stop
        failed.append(f"{mod}: {type(e).__name__}: {e}")
try:
    from packaging.requirements import Requirement
    env = {"extra": ""}
    for dist in md.distributions(path=[site]):
        if dist.metadata["Name"].lower() == "d2l":
            continue  # installed without its 2023 pins on purpose (requirements-nodeps.txt)
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker and not req.marker.evaluate(env):
                continue
            try:
                have = md.version(req.name)
            except md.PackageNotFoundError:
                print(f"  WARNING: {dist.metadata['Name']} needs {req}, which is not installed")
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                print(f"  WARNING: {dist.metadata['Name']} needs {req}, found {have}")
except ImportError:
    print("  (packaging not importable: requirements of the carried wheels not checked)")
has_torch = importlib.util.find_spec("torch") is not None
if has_torch:
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    print(f"  torch {torch.__version__}, GPU: {gpu or 'none'}")
    if need_gpu and gpu is None:
        failed.append("torch sees no CUDA GPU: a reference run needs one")
elif need_gpu:
    failed.append("torch is not importable")
if failed:
    sys.exit("preflight FAILED:\n  " + "\n  ".join(failed))

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

spec = KernelSpecManager().get_kernel_spec("python3")
print(f"  kernel python3: {' '.join(spec.argv)}")
nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell(
    "import sys, ipywidgets\n"
    "s = ipywidgets.IntSlider(value=42)\n"
    "print('kernel ok', sys.version.split()[0], sys.executable, 'ipywidgets', ipywidgets.__version__, s.value)")]
if importlib.util.find_spec("matplotlib") is not None:  # the backend the suite sets
    nb.cells.append(nbformat.v4.new_code_cell(
        "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\n"
        "print('kernel matplotlib', matplotlib.__version__, matplotlib.get_backend())"))
if has_torch:  # what notebook 00 imports; the kernel must see the GPU too
    nb.cells.append(nbformat.v4.new_code_cell(
        "import torch\nfrom d2l import torch as d2l\n"
        "print('kernel torch', torch.__version__, 'cuda', torch.cuda.is_available())"))
NotebookClient(nb, timeout=120, kernel_name="python3").execute()
for cell in nb.cells:
    for out in cell.outputs:
        if "text" in out:
            print("  " + out["text"].strip())
        elif "image/png" in out.get("data", {}):
            print(f"  (an inline PNG figure, {len(out['data']['image/png'])} base64 characters)")
print("preflight ok")
PYEOF

# Run one step under the time limit; a step that overruns is stopped (TERM, then KILL) so that
# what it finished is still packed into the output folder before the command's own limit.
step() {
    local rc=0
    echo "== $* (stopped after ${STEP_SECONDS} s)"
    timeout --signal=TERM --kill-after=20 "$STEP_SECONDS" "$@" || rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "== STOPPED at the ${STEP_SECONDS} s limit: split the work over more calls"
    fi
    echo "== exit status $rc"
    return "$rc"
}

# A suite call that did not finish (a notebook failed, or the limit stopped it) saves nothing
# itself; keep the notebooks that did finish, so the next call need not run them again.
salvage() {
    if [ ! "$BUILD/latest/run.json" -nt "$STAMP" ]; then
        echo "== no notebook finished in this call"
        return 0
    fi
    FTG_GLOB="$GLOB" "$PY" - <<'PYEOF'
import json, os, shutil, tempfile
from pathlib import Path

from helpers.suite import runner, runs

run = runs.latest_run()  # the suite's run folder: build/runs/<time>/
log = json.loads((run / "run.json").read_text())["notebooks"]
ok = [n for n, r in log.items() if r["status"] == "ok" and (run / "results" / f"{n}.json").is_file()]
failed = [n for n, r in log.items() if r["status"] != "ok"]
unfinished = [p.stem for p in runner.notebook_paths(os.environ["FTG_GLOB"]) if p.stem not in log]
print(f"== finished ok: {', '.join(ok) or 'none'}; failed: {', '.join(failed) or 'none'}; "
      f"stopped or not reached: {', '.join(unfinished) or 'none'}")
if ok:
    with tempfile.TemporaryDirectory() as tmp:
        for n in ok:
            shutil.copy2(run / "results" / f"{n}.json", Path(tmp) / f"{n}.json")
        print(f"== saved the finished notebooks' results to {runner.save_reference(Path(tmp))}")
PYEOF
}

# Pack what this call produced into the output folder (at most 5 files, so few come back).
collect() {
    local new
    new=$(find results/reference -type f -newer "$STAMP" 2>/dev/null | sort)
    if [ -n "$new" ]; then
        printf '%s\n' "$new" | tar -czf "$OUT/reference-$TAG.tar.gz" -T -
        echo "== packed into reference-$TAG.tar.gz:"
        printf '   %s\n' $new
    else
        echo "== nothing new under results/reference/ in this call"
    fi
    if [ "$SUB" = notebooks ]; then
        # only this call's: a warm machine keeps build/ from the call before
        [ "$BUILD/report.md" -nt "$STAMP" ] && cp "$BUILD/report.md" "$OUT/report-$TAG.md"
        [ "$BUILD/latest/run.json" -nt "$STAMP" ] || return 0
        cp "$BUILD/latest/run.json" "$OUT/run-$TAG.json"
        local failed
        failed=$("$PY" -c 'import json, sys; d = json.load(open(sys.argv[1]))["notebooks"]
print(" ".join(f"{n}.ipynb" for n, r in d.items() if r["status"] != "ok"))' "$BUILD/latest/run.json" \
            2>/dev/null || true)
        if [ -n "$failed" ]; then
            # shellcheck disable=SC2086
            tar -czf "$OUT/failed-$TAG.tar.gz" -C "$BUILD/latest/notebooks" $failed 2>/dev/null || true
            if [ -f "$OUT/failed-$TAG.tar.gz" ] \
                && [ "$(stat -c %s "$OUT/failed-$TAG.tar.gz")" -gt $((15 * 1048576)) ]; then
                rm -f "$OUT/failed-$TAG.tar.gz"
                echo "== executed copies of the failed notebooks too large to bring back"
            fi
        fi
    fi
}

# `all`: every notebook in the gpu profile, FTG_STREAMS at a time, each in its own suite call (one
# that fails or hangs costs only itself), until the step limit; packed after each notebook.
run_all() {
    local deadline=$(( $(date +%s) + STEP_SECONDS )) streams=${FTG_STREAMS:-}
    if [ -z "$streams" ]; then
        if [ "$(nproc)" -ge 8 ]; then streams=3; else streams=1; fi
    fi
    [[ $streams =~ ^[1-9][0-9]*$ ]] || die "FTG_STREAMS must be a whole number >= 1, got '$streams'"
    mapfile -t names < <(cd notebooks && ls [0-9][0-9]*_*.ipynb | sed 's/\.ipynb$//')
    echo "== all: ${#names[@]} notebooks, $streams at a time, gpu profile, until $(date -d "@$deadline" +%T)"
    local i pids=()
    for (( i = 0; i < streams; i++ )); do
        (
            local j left
            for (( j = i; j < ${#names[@]}; j += streams )); do
                left=$(( deadline - $(date +%s) ))
                if [ "$left" -lt 15 ]; then echo "== ${names[j]}: not started, the limit is near"; continue; fi
                FTG_STREAM=$i timeout --signal=TERM --kill-after=10 "$left" "$PY" -m helpers.suite \
                    --profile gpu --notebooks "${names[j]}" --timeout "$left" > "$OUT/.stream-$i.out" 2>&1
                # the runner's line for it ("NAME: ok in 12 s"), after the progress bar's last \r
                tr '\r' '\n' < "$OUT/.stream-$i.out" | grep -aE "^ *${names[j]}: (ok|failed|interrupted) in" || true
                FTG_STREAMS_USED=$streams pack_all
            done
        ) &
        pids+=($!)
    done
    wait "${pids[@]}" || true  # not a bare `wait`: it would wait for the log's tee as well
    rm -f "$OUT"/.stream-*.out
    FTG_STREAMS_USED=$streams pack_all
}

# What `all` brings back, rewritten after each notebook so a stopped call still returns it.
pack_all() {
    FTG_OUT="$OUT" FTG_TAG="$TAG" FTG_STAMP="$STAMP" "$PY" - <<'PYEOF' || echo "== packing failed"
import json, os, shutil, tarfile, tempfile, time
from pathlib import Path

from helpers import paths
from helpers.suite import report

out, tag = Path(os.environ["FTG_OUT"]), os.environ["FTG_TAG"]
since = Path(os.environ["FTG_STAMP"]).stat().st_mtime
root = paths.build_dir() / "runs"
combined = root / f"all-{tag}"  # this call's notebooks as one run, for one report
done = {}
for log_path in sorted(root.glob("*/run.json")):
    if log_path.parent == combined or log_path.stat().st_mtime < since:
        continue  # a warm machine keeps the runs of a call before
    log = json.loads(log_path.read_text())
    for name, res in log.get("notebooks", {}).items():
        done[name] = {**res, "run": log_path.parent.name}
for sub in ("results", "notebooks"):
    (combined / sub).mkdir(parents=True, exist_ok=True)
for name, res in done.items():
    for sub, suffix in (("results", ".json"), ("notebooks", ".ipynb")):
        src = root / res["run"] / sub / f"{name}{suffix}"
        if src.is_file():
            shutil.copy2(src, combined / sub / src.name)
gpu = os.popen("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null").read().strip()
summary = {
    "device": gpu.splitlines()[0] if gpu else "no GPU (FTG_ALLOW_NO_GPU=1)",
    "profile": "gpu",
    "streams": int(os.environ.get("FTG_STREAMS_USED", "1")),
    "notebooks": done,
    "total_seconds": round(sum(r["seconds"] for r in done.values()), 1),
}
log = {"profile": "gpu", "run": combined.name, "state": "finished", "notebooks": done,
       "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))}
(combined / "run.json").write_text(json.dumps(log, indent=1))
report.write(combined)
(out / f"report-{tag}.md").write_bytes((combined / "report.md").read_bytes())
(out / f"seconds-{tag}.json").write_text(json.dumps(summary, indent=1))
failed = [n for n, r in done.items() if r["status"] != "ok"]
ok = [n for n, r in done.items() if r["status"] == "ok"]
for kind, names, member in (("failed", failed, "notebooks/{}.ipynb"), ("reference", ok, "results/{}.json")):
    paths_in = [combined / member.format(n) for n in names if (combined / member.format(n)).is_file()]
    if not paths_in:
        continue
    with tempfile.NamedTemporaryFile(dir=out, prefix=".", suffix=".tar.gz", delete=False) as f:
        with tarfile.open(f.name, "w:gz") as tar:
            for path in paths_in:
                tar.add(path, arcname=path.name)
    os.chmod(f.name, 0o644)
    Path(f.name).replace(out / f"{kind}-{tag}.tar.gz")
capstone = [combined / "results" / f"{n}.json" for n in ok if n.startswith("18_")]
if capstone and capstone[0].is_file():
    from benchmarks.capstone import bench_rows, table

    rows = bench_rows(json.loads(capstone[0].read_text()))
    (out / f"bench_capstone-{tag}.md").write_text(table(rows) + "\n")
PYEOF
}

rc=0
case "$SUB" in
    all) run_all ;;
    check) ;;  # the preflight was all
    bench)
        step "$PY" -m benchmarks.capstone "${BENCH_ARGS[@]}" || rc=$?
        collect
        ;;
    notebooks)
        step "$PY" -m helpers.suite --profile full --yes --notebooks "$GLOB" --save-reference \
            --timeout "$STEP_SECONDS" || rc=$?
        [ "$rc" -eq 0 ] || salvage || echo "== salvage failed"
        collect
        ;;
esac

echo
echo "== files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
if [ "$SUB" = all ]; then
    cat <<EOF
== NEXT, on the development machine, in the repository root: seconds-$TAG.json holds each
   notebook's seconds (catalog.toml's measured figures come from it once it is committed):
   mkdir -p results/reference/<date>_<gpu>/gpu
   cp <this output folder>/seconds-$TAG.json results/reference/<date>_<gpu>/gpu/seconds.json
   tar -xzf <this output folder>/reference-$TAG.tar.gz -C results/reference/<date>_<gpu>/gpu
   failed-$TAG.tar.gz holds the executed copies of the notebooks that failed.
EOF
elif [ -f "$OUT/reference-$TAG.tar.gz" ]; then
    added=$(tar -tzf "$OUT/reference-$TAG.tar.gz" | xargs -n1 dirname | sort -u | tr '\n' ' ')
    cat <<EOF
== NEXT, on the development machine, in the repository root:
   tar -xzf <this output folder>/reference-$TAG.tar.gz   # adds to $added
   git status --short results/reference/   # the new files
   make run                                # the report shows the reference beside this machine's
   git add results/reference/ && git commit -m 'Reference results (GPU): ...'
   The other steps, one call each: bench, notebooks '0[0-4]_*', '0[5-9]_*', '1[0-4]_*', '1[5-8]_*'.
EOF
elif [ "$SUB" != check ]; then
    echo "== NOTHING to bring back from this call: no new reference results (see the log above)"
fi
[ "$rc" -eq 0 ] || echo "== $PROG: the step failed (exit status $rc); see $TAG.log"
exit "$rc"
