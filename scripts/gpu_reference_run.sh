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
#     --step-seconds N     time limit of the step (default 510: with install and preflight
#                          (~30 s), up to 10 s to stop a step and a few to pack, a call ends
#                          within a 10-minute limit; raise it where commands may run longer).
#                          For `all` it counts from the call's start, install and preflight
#                          included (default 540: stopping and packing the last notebook fit
#                          in the rest of 10 minutes)
#
# `all` is the one-call check of a GPU: the preflight, then every notebook in the default `gpu`
# profile, ONE AT A TIME (the catalog's H100 budgets are seconds of a notebook alone on the
# machine): the capstone (19) first, then the others longest budget first (budget_seconds_h100
# in notebooks/catalog.toml), each in its own suite call under a limit of 1.5 times its budget
# plus 30 s. A notebook that fails or overruns is recorded as failed (its error and the tail of
# its output) and the next one runs; one whose budget no longer fits before the call's deadline
# is recorded as "not run: out of time" and a shorter one is tried. After each notebook what
# finished is packed (each file written whole, then renamed), so a call that is killed still
# returns it; SIGTERM or Ctrl-C stop the running notebook, pack and clean up. At most 6 files:
#     all-<time>.log, seconds-<time>.json (each notebook's status, seconds and budget, the ones
#     not run and why), report-<time>.md, bench_capstone-<time>.md (notebook 19's table),
#     failed-<time>.tar.gz (executed copies and kernel logs of the failures),
#     reference-<time>.tar.gz (the passing notebooks' results for results/reference/)
# Its exit status: 0 when every notebook ran and passed, 1 when one failed or was not run,
# 128+N when signal N stopped it.
#
# Every subcommand first checks, before any pip, that FTG_PYTHON is a Python that
# pyproject.toml's requires-python admits, on Linux x86_64 or aarch64, and that the wheels in
# .whl/ were fetched for that Python and machine; then installs .whl/*.whl into a private folder
# (removed when the call ends, also when it fails or is stopped), imports every runtime package
# of requirements.txt at no less than its floor in pyproject.toml, checks that a kernel starts and
# sees the GPU, runs its step under the time limit, and leaves in DIR:
#     <sub>-<time>.log                 everything printed (written as it runs: it is there
#                                      even when the command is killed)
#     reference-<sub>-<time>.tar.gz    the files this call added under results/reference/
#     report-<sub>-<time>.md, run-<sub>-<time>.json   the suite's report and per-notebook times
#     failed-<sub>-<time>.tar.gz       executed copies of notebooks that failed, if any
# Settings (environment): FTG_PYTHON (default python3), FTG_SITE (where the wheels are installed;
# default a new private folder from `mktemp -d`, removed at the end; a folder named here is
# kept), FTG_ALLOW_NO_GPU=1 (run without a GPU: only for this script's own tests,
# tests/test_gpu_scripts.py, which run `all` on a few tiny notebooks in a copy of the repository
# with its own notebooks/ and catalog.toml; a reference run needs the GPU).
# Each suite call keeps every run folder (FTG_KEEP_RUNS=0): `all` makes one per notebook.
# DEVELOPERS.md, "Reference runs on an offline GPU node", has the whole procedure.
set -euo pipefail

PROG=gpu_reference_run.sh
PY=${FTG_PYTHON:-python3}
SITE=${FTG_SITE:-}  # empty: a private folder made by mktemp -d once the arguments are read
DEFAULT_STEP_SECONDS=510
ALL_STEP_SECONDS=540  # `all`: from the call's start, so its end stays within 600 s
KILL_AFTER=10         # a step or notebook still running this long after its TERM gets KILL
INSTALL_SECONDS=120   # the time slices of the stages before the step
PREFLIGHT_SECONDS=150
START_SECONDS=15      # `all`: a notebook starts only if its budget and this much are left
DEFAULT_BUDGET=60     # `all`: the budget of a notebook the catalog does not list

usage() {
    cat <<'EOF'
usage: bash scripts/gpu_reference_run.sh --out DIR [--step-seconds N] all | check | bench [ARGS] | notebooks GLOB
  --out DIR          folder for the log and the packed results (required)
  --step-seconds N   time limit of the step (default 510; `all`: 540 from the call's start):
                     a call then ends within 10 minutes
  all                the one-call check: preflight, then every notebook in the gpu profile one
                     at a time, the capstone first, then longest H100 budget first; a failure is
                     recorded and the next one runs; packed after each notebook into at most 6
                     files (notebooks/catalog.toml gives the order and each notebook's limit)
  check              check the Python, install the wheels in .whl/, import the runtime packages,
                     start a kernel, show the GPU; nothing else
  bench [ARGS]       the capstone benchmark (python3 -m benchmarks.capstone ARGS), e.g.
                     bench --accuracy-epochs 3 if the defaults overrun the limit
  notebooks GLOB     python3 -m helpers.suite --profile full --yes --notebooks GLOB --save-reference
                     the notebooks in four calls: '0[0-4]_*', '0[5-9]_*', '1[0-4]_*', '1[5-8]_*'
Runs on the GPU node, offline; needs .whl/ (bash scripts/gpu_wheels.sh on a machine with internet).
Environment: FTG_PYTHON (default python3), FTG_SITE (default a private folder, removed at the
end), FTG_ALLOW_NO_GPU=1 (this script's own tests only: no GPU needed).
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
    all) [ $# -eq 1 ] || die "'all' takes no arguments" ;;
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

CALL_START=$(date +%s)
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${FTG_BUILD_DIR:-$ROOT/build}  # where helpers.suite writes (helpers/paths.py)
compgen -G ".whl/*.whl" >/dev/null || die ".whl/ holds no wheels in $ROOT. Run \
'bash scripts/gpu_wheels.sh' on a machine with internet, then copy .whl/ here with the repository."
command -v "$PY" >/dev/null || die "no $PY on this machine (FTG_PYTHON names another)"

# "3.12.3" within a requires-python such as ">=3.11" or ">=3.11,<3.15": status 0 if it is, 1 if
# not, 2 if the specifier is not of that simple form.
version_in() {
    local have clause want
    local -a clauses
    vnum() { local IFS=.; local -a v; read -r -a v <<<"$1"; echo $(( ${v[0]:-0} * 1000000 + ${v[1]:-0} * 1000 + ${v[2]:-0} )); }
    have=$(vnum "$1")
    IFS=, read -r -a clauses <<<"${2// /}"
    [ "${#clauses[@]}" -gt 0 ] || return 2
    for clause in "${clauses[@]}"; do
        [[ $clause =~ ^(\>=|\<=|==|!=|\>|\<)([0-9]+(\.[0-9]+){0,2})$ ]] || return 2
        want=$(vnum "${BASH_REMATCH[2]}")
        case "${BASH_REMATCH[1]}" in
            '>=') [ "$have" -ge "$want" ] ;;
            '<=') [ "$have" -le "$want" ] ;;
            '>') [ "$have" -gt "$want" ] ;;
            '<') [ "$have" -lt "$want" ] ;;
            '==') [ "$have" -eq "$want" ] ;;
            '!=') [ "$have" -ne "$want" ] ;;
        esac || return 1
    done
}

# Before any pip: the Python and the machine. pip would install wheels for another Python or
# machine only to fail later at an import, and a Python outside requires-python fails in the
# middle of a notebook; both say so here, in a second.
check_python_and_platform() {
    local spec info ver system machine st=0 whl base py abi plat pytag
    local -a tags bad=()
    spec=$(sed -n 's/^requires-python *= *"\([^"]*\)".*/\1/p' pyproject.toml 2>/dev/null | head -n 1)
    [ -n "$spec" ] || die "no requires-python in $ROOT/pyproject.toml: is this the repository root?"
    # %-formatting: any Python answers, however old
    info=$("$PY" -c 'import platform, sys
print("%d.%d.%d %s %s" % (tuple(sys.version_info[:3]) + (platform.system(), platform.machine())))' \
        2>&1) || die "$PY does not run: $info"
    read -r ver system machine <<<"$info"
    [[ $ver =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "cannot read the version of $PY: '$info'"
    version_in "$ver" "$spec" || st=$?
    [ "$st" -ne 2 ] || die "cannot read pyproject.toml's requires-python '$spec' (>=, <, == only)"
    [ "$st" -eq 0 ] || die "$PY is Python $ver; this project needs Python $spec (pyproject.toml's \
requires-python): name another with FTG_PYTHON=/path/to/python3"
    case "$system $machine" in
        "Linux x86_64" | "Linux aarch64") ;;
        *) die "$PY runs on $system $machine; the reference run needs Linux on x86_64 or aarch64 \
(the manylinux wheels of scripts/gpu_wheels.sh)" ;;
    esac
    pytag="cp${ver%.*}" && pytag=${pytag/./}  # 3.12.3 -> cp312
    for whl in .whl/*.whl; do
        base=${whl##*/}
        IFS=- read -r -a tags <<<"${base%.whl}"
        if [ "${#tags[@]}" -lt 5 ]; then bad+=("$base (not a wheel's name)"); continue; fi
        py=${tags[-3]} abi=${tags[-2]} plat=${tags[-1]}
        if [ "$plat" != any ] && { [[ $plat != *linux* ]] || [[ ".$plat." != *"_$machine."* ]]; }; then
            bad+=("$base (for $plat, not $machine)")
        elif [[ $abi =~ ^cp[0-9]+$ ]] && [ "$abi" != "$pytag" ]; then
            bad+=("$base (for $abi, not $pytag)")
        elif [ "$abi" = abi3 ] && [[ $py =~ ^cp3([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -gt "${pytag#cp3}" ]; then
            bad+=("$base (for $py or later, not $pytag)")
        fi
    done
    [ "${#bad[@]}" -eq 0 ] || die "the wheels in .whl/ do not fit Python $ver on $machine: \
${bad[*]}. Fetch them for this node: FTG_WHEELS_PYTHON=${ver%.*} FTG_WHEELS_ARCH=$machine \
bash scripts/gpu_wheels.sh"
    echo "== Python $ver on $system $machine ($PY): requires-python $spec met; wheels fit"
}

OWN_SITE=""
if [ -z "$SITE" ]; then SITE=$(mktemp -d "${TMPDIR:-/tmp}/ftg-site.XXXXXX"); OWN_SITE=1; fi
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/ftg-call.XXXXXX")  # this call's notes, removed at the end
TAG="$SUB-$(date -u +%H%M%S)"
LOG="$OUT/$TAG.log"
# tee ignores the signals that stop the call (sent to the whole process group), so the log
# goes on to record the stopping and the packing
exec > >(trap '' INT TERM HUP; exec tee -a "$LOG") 2>&1
TEE_PID=$!
STAMP=$SCRATCH/stamp
touch "$STAMP"
CHILD=""    # the step running now (its `timeout`), for the signal handler to stop
STOPPED=""  # the signal that asked the call to stop
finish() {
    local rc=$?
    trap - EXIT
    # a stage still running when the call ends (it died of an error): not left behind
    [ -z "$CHILD" ] || kill -TERM "$CHILD" 2>/dev/null || true
    if [ -n "$OWN_SITE" ]; then
        rm -rf "$SITE" && echo "== removed the private wheel folder $SITE" || true
    fi
    rm -rf "$SCRATCH"
    exec 1>&- 2>&-
    wait "$TEE_PID" 2>/dev/null || true
    exit "$rc"
}
trap finish EXIT
# A signal stops the running stage (its `timeout` passes it on, and kills after KILL_AFTER s);
# the call then packs what finished and exits with 128+N, removing the private folders.
on_signal() {
    [ -z "$STOPPED" ] || return 0
    STOPPED=$1
    echo "== $PROG: SIG$1 received: stopping the running stage, then packing what finished"
    [ -z "$CHILD" ] || kill -TERM "$CHILD" 2>/dev/null || true
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP
stop_status() { echo $((128 + $(kill -l "$STOPPED"))); }
# A stage before the step that failed: an error (2), or the signal's status if one stopped it.
stage_failed() {
    [ -z "$STOPPED" ] || { echo "== $PROG: stopped by SIG$STOPPED during: $*"; exit "$(stop_status)"; }
    die "$@"
}

# "$@" under `timeout SECONDS`, in the background and waited for: bash runs a trap only once a
# foreground command has ended, and the handler must be able to stop this one at once. Its stdin
# is the caller's (a here-document).
limited() {
    local secs=$1 rc
    shift
    timeout --signal=TERM --kill-after="$KILL_AFTER" "$secs" "$@" <&0 &
    CHILD=$!
    while :; do
        rc=0
        wait "$CHILD" || rc=$?
        # a trapped signal ends `wait` early (status > 128) while the stage still runs
        if [ "$rc" -gt 128 ] && kill -0 "$CHILD" 2>/dev/null; then continue; fi
        break
    done
    CHILD=""
    return "$rc"
}

export PYTHONUNBUFFERED=1
export FTG_OFFLINE=${FTG_OFFLINE:-1}  # the machine reaches nothing: skip download attempts
export FTG_KEEP_RUNS=0  # `all` starts a suite run per notebook: none may remove an earlier one
echo "== $PROG $* on $(hostname) at $(date -u '+%Y-%m-%d %H:%M:%S') UTC, step limit ${STEP_SECONDS} s"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
    || echo "(no nvidia-smi here)"
check_python_and_platform
echo "== installing $(compgen -G '.whl/*.whl' | wc -l) wheels into $SITE"
limited "$INSTALL_SECONDS" "$PY" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$SITE" .whl/*.whl </dev/null \
    || stage_failed "installing the wheels failed or took over $INSTALL_SECONDS s"
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"

# Preflight (about 10-30 s): every runtime package of requirements.txt importable at no less than
# its floor in pyproject.toml, the carried wheels' requirements met by what the machine has, a
# python3 kernel that starts and imports ipywidgets, and the GPU. Writes the machine's line for
# `all`'s seconds file.
echo "== preflight"
NEED_GPU=1
if [ "$SUB" = check ] || [ "${FTG_ALLOW_NO_GPU:-0}" = 1 ]; then NEED_GPU=0; fi
FTG_SITE="$SITE" FTG_NEED_GPU=$NEED_GPU FTG_SCRATCH="$SCRATCH" \
    limited "$PREFLIGHT_SECONDS" "$PY" - <<'PYEOF' \
    || stage_failed "preflight failed or took over $PREFLIGHT_SECONDS s"
import importlib, importlib.metadata as md, importlib.util, json, os, re, sys, time, tomllib
from pathlib import Path

site, need_gpu = os.environ["FTG_SITE"], os.environ["FTG_NEED_GPU"] == "1"
print(f"python {sys.version.split()[0]} at {sys.executable}")
failed = []


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(path):  # the names a requirements file pins, in its order
    lines = (ln.split("#", 1)[0].strip() for ln in Path(path).read_text().splitlines())
    return [norm(re.split(r"[<>=!~\[;\s]", ln, maxsplit=1)[0]) for ln in lines if ln]


# Floors: pyproject.toml's lower bounds. Required: its dependencies and what d2l.torch imports
# (the `d2l` extra, d2l itself); the rest of requirements.txt (JupyterLab, nbconvert for the
# report's HTML) is reported, not required, on a headless node.
project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
groups = {"": project["dependencies"], **project.get("optional-dependencies", {})}
floors, required = {}, set(pinned("requirements-nodeps.txt"))
for group, reqs in groups.items():
    for req in reqs:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^]]*\])?\s*(?:>=\s*([^,;\s]+))?", req)
        floors.setdefault(norm(m[1]), m[2])
        if group in ("", "d2l"):
            required.add(norm(m[1]))
modules = {"pillow": "PIL", "jupyterlab": "jupyterlab", "ipykernel": "ipykernel"}
try:
    from packaging.version import Version
except ImportError as e:
    sys.exit(f"preflight FAILED:\n  packaging: {e} (needed to compare versions)")
names = list(dict.fromkeys(pinned("requirements.txt") + pinned("requirements-nodeps.txt")))
for name in names:
    module, need = modules.get(name, name.replace("-", "_")), name in required
    try:
        t0 = time.perf_counter()
        m = importlib.import_module(module)
        have = md.version(name)
        took = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - report every missing piece, then stop
        (failed.append if need else print)(
            f"{'' if need else '  (optional) '}{name}: {type(e).__name__}: {e}"
        )
        continue
    floor, where = floors.get(name), os.path.dirname(m.__file__ or "")
    low = floor is not None and Version(have) < Version(floor)
    if low and need:
        failed.append(f"{name} {have} is older than pyproject.toml's floor {floor}")
    print(f"  {name:18} {have:14} >= {floor or '-':10} {took:4.1f} s  {where}"
          + ("  OLDER THAN ITS FLOOR" if low else ""))
for mod in ("nbclient", "nbformat", "jupyter_client", "ipykernel", "ipywidgets",
            "matplotlib_inline", "IPython", "d2l"):
    try:
        importlib.import_module(mod)
    except Exception as e:  # noqa: BLE001
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
machine = {"device": "no GPU (FTG_ALLOW_NO_GPU=1)", "cpu_cores": os.cpu_count()}
if importlib.util.find_spec("torch") is not None:
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    print(f"  torch {torch.__version__}, GPU: {gpu or 'none'}")
    machine.update(torch=torch.__version__, **({"device": gpu} if gpu else {}))
    if need_gpu and gpu is None:
        failed.append("torch sees no CUDA GPU: a reference run needs one")
if failed:
    sys.exit("preflight FAILED:\n  " + "\n  ".join(failed))
(Path(os.environ["FTG_SCRATCH"]) / "machine.json").write_text(json.dumps(machine))

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
nb.cells.append(nbformat.v4.new_code_cell(  # the backend the suite sets
    "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
    "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\n"
    "print('kernel matplotlib', matplotlib.__version__, matplotlib.get_backend())"))
nb.cells.append(nbformat.v4.new_code_cell(  # what notebook 00 imports; the kernel must see the GPU
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
    limited "$STEP_SECONDS" "$@" </dev/null || rc=$?
    if [ -n "$STOPPED" ]; then
        echo "== STOPPED by SIG$STOPPED"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
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
ok = [n for n, r in log.items() if r.get("status") == "ok" and (run / "results" / f"{n}.json").is_file()]
failed = [n for n, r in log.items() if r.get("status") != "ok"]
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
print(" ".join(f"{n}.ipynb" for n, r in d.items() if r.get("status") != "ok"))' "$BUILD/latest/run.json" \
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

# `all`'s order: "name budget" lines, the capstone (19) first, then the longest H100 budget
# first (notebooks/catalog.toml), ties in teaching order.
all_plan() {
    FTG_DEFAULT_BUDGET=$DEFAULT_BUDGET "$PY" - <<'PYEOF'
import os, sys, tomllib
from pathlib import Path

catalog = Path("notebooks/catalog.toml")
entries = tomllib.loads(catalog.read_text())["notebook"] if catalog.is_file() else []
budgets = {Path(e["file"]).stem: e.get("budget_seconds_h100") for e in entries}
names = sorted(p.stem for p in Path("notebooks").glob("[0-9][0-9]*_*.ipynb"))
default = int(os.environ["FTG_DEFAULT_BUDGET"])
for n in names:
    if budgets.get(n) is None:
        print(f"== {n}: no budget_seconds_h100 in {catalog}: {default} s assumed", file=sys.stderr)
budget = {n: int(budgets.get(n) or default) for n in names}
for n in sorted(names, key=lambda n: (not n.startswith("19_"), -budget[n], n)):
    print(n, budget[n])
PYEOF
}

# `all`: every notebook in the gpu profile, one at a time, each in its own suite call under its
# own limit (one that fails or hangs costs only itself), until the call's deadline; packed
# after each notebook. Each outcome goes to $SCRATCH/ledger.jsonl for pack_all.
run_all() {
    local deadline=$((CALL_START + STEP_SECONDS)) i name budget limit left rc t0 state
    local -a plan
    mapfile -t plan < <(all_plan)
    [ "${#plan[@]}" -gt 0 ] || die "no notebooks in $ROOT/notebooks"
    printf '%s\n' "${plan[@]}" > "$SCRATCH/plan"
    echo "== all: ${#plan[@]} notebooks one at a time, gpu profile, the capstone first, then the" \
        "longest H100 budget first; none started after $(date -d "@$deadline" +%T)" \
        "without its budget + ${START_SECONDS} s left"
    for i in "${!plan[@]}"; do
        [ -z "$STOPPED" ] || break
        read -r name budget <<<"${plan[i]}"
        left=$((deadline - $(date +%s)))
        if [ "$left" -lt $((budget + START_SECONDS)) ]; then
            echo "== $name: not run: out of time (${left} s left, its H100 budget ${budget} s)"
            printf '{"name": "%s", "not_run": "out of time: %d s left of the call, its H100 budget %d s"}\n' \
                "$name" "$left" "$budget" >> "$SCRATCH/ledger.jsonl"
            continue
        fi
        limit=$((budget * 3 / 2 + 30))  # margin: the kernel's start, a slower node
        [ "$limit" -le "$left" ] || limit=$left
        echo "== $name (H100 budget ${budget} s, stopped after ${limit} s)"
        t0=$(date +%s)
        rc=0
        limited "$limit" "$PY" -m helpers.suite --profile gpu --notebooks "$name" \
            --timeout "$limit" > "$SCRATCH/$name.out" 2>&1 </dev/null || rc=$?
        # the runner's line for it ("NAME: ok in 12 s"), after the progress bar's last \r
        tr '\r' '\n' < "$SCRATCH/$name.out" | grep -aE "^ *${name}: (ok|failed|interrupted) in" || true
        if [ "$rc" -ne 0 ]; then
            echo "   exit status $rc; the last lines of its output:"
            tr '\r' '\n' < "$SCRATCH/$name.out" | grep -av -e '^\s*$' -e 'notebook/s]\s*$' \
                | tail -n 15 | sed 's/^/   | /' || true
        fi
        printf '{"name": "%s", "rc": %d, "wall": %d, "limit": %d, "budget": %d, "stopped": "%s"}\n' \
            "$name" "$rc" $(($(date +%s) - t0)) "$limit" "$budget" "$STOPPED" >> "$SCRATCH/ledger.jsonl"
        [ "$i" -eq $((${#plan[@]} - 1)) ] || pack_all running  # the last: packed once, below
    done
    state=finished
    [ -z "$STOPPED" ] || state=SIG$STOPPED
    pack_all "$state"
}

# What `all` brings back, rewritten whole (a temporary file renamed) after each notebook, so a
# call killed at any moment still returns what finished. $1: the call's state (running,
# finished, or the signal that stopped it). Reads the ledger and the suite's run folders; an
# entry the suite left unfinished ({"status": "running"}) is read, never trusted.
pack_all() {
    FTG_OUT="$OUT" FTG_TAG="$TAG" FTG_STAMP="$STAMP" FTG_SCRATCH="$SCRATCH" FTG_STATE="$1" \
        "$PY" - <<'PYEOF' || echo "== packing failed (the files of the last packing stay)"
import json, os, shutil, sys, tarfile, tempfile, time
from pathlib import Path

from helpers import paths

out, tag, state = Path(os.environ["FTG_OUT"]), os.environ["FTG_TAG"], os.environ["FTG_STATE"]
scratch = Path(os.environ["FTG_SCRATCH"])
since = Path(os.environ["FTG_STAMP"]).stat().st_mtime
root = paths.build_dir() / "runs"
combined = root / f"all-{tag}"  # this call's notebooks as one run, for one report


def put(name, data):
    """`out/name` written whole: a reader never sees half a file."""
    paths.write_atomic(out / name, data)


plan = [ln.split() for ln in (scratch / "plan").read_text().splitlines() if ln.strip()]
ledger_path = scratch / "ledger.jsonl"  # one line per notebook, appended as each ends
lines = ledger_path.read_text().splitlines() if ledger_path.is_file() else []
ledger = {e["name"]: e for e in map(json.loads, lines)}
suite = {}  # name -> (run folder, the suite's entry) of this call's runs
for log_path in sorted(root.glob("*/run.json")):
    if log_path.parent == combined or log_path.stat().st_mtime < since:
        continue  # a warm machine keeps the runs of a call before
    try:
        log = json.loads(log_path.read_text())
    except (OSError, ValueError):
        continue
    for name, res in log.get("notebooks", {}).items():
        suite[name] = (log_path.parent, res)


def tail(name, lines=20):
    """The last lines of the suite's output for `name`, without its progress bars."""
    path = scratch / f"{name}.out"
    text = path.read_text(errors="replace").replace("\r", "\n") if path.is_file() else ""
    keep = [ln for ln in text.splitlines() if ln.strip() and not ln.rstrip().endswith("notebook/s]")]
    return keep[-lines:]


stopped = state if state.startswith("SIG") else ""
notebooks, not_run, to_run, ok, failed = {}, [], [], [], []
for name, budget in plan:
    e = ledger.get(name)
    if e is None:
        (not_run if stopped else to_run).append(
            f"{name} (not reached: the call was stopped by {stopped})" if stopped else name
        )
        continue
    if "not_run" in e:
        not_run.append(f"{name} ({e['not_run']})")
        continue
    run, res = suite.get(name, (None, {}))
    status, error = res.get("status"), res.get("error", "")
    if e["stopped"]:
        status, error = "interrupted", f"the call was stopped by SIG{e['stopped']} while it ran"
    elif e["rc"] in (124, 137):
        status = "failed"
        error = f"stopped at its limit of {e['limit']} s (H100 budget {budget} s); {error}"
    elif status not in ("ok", "failed"):
        status = "failed"
        error = f"the suite exited with status {e['rc']} before it recorded the notebook; {error}"
    entry = {
        "status": status,
        "seconds": res.get("seconds", e["wall"]),
        "beside": "alone",
        "budget_seconds_h100": int(budget),
        "limit_seconds": e["limit"],
    }
    if status != "ok":
        entry.update(error=error.strip("; "), tail=tail(name))
    notebooks[name] = {"runs": [entry]}
    (ok if status == "ok" else failed).append((name, run))

machine_path = scratch / "machine.json"
machine = json.loads(machine_path.read_text()) if machine_path.is_file() else {}
summary = {
    **machine,
    "date": time.strftime("%Y-%m-%d", time.gmtime(since)),
    "profile": "gpu",
    "how": "bash scripts/gpu_reference_run.sh all: python -m helpers.suite --profile gpu "
    "--notebooks NAME --timeout LIMIT, one notebook at a time (alone), the capstone first, then "
    "the longest H100 budget first; seconds include the kernel's start",
    "state": state,
    "order": [name for name, _ in plan],
    "not_run": not_run,
    **({"to_run": to_run} if to_run else {}),
    "notebooks": notebooks,
}
put(f"seconds-{tag}.json", json.dumps(summary, indent=1) + "\n")

# The executed copies of the failures (with their kernels' logs), the passing results.
for kind, names, members in (
    ("failed", failed, ("notebooks/{}.ipynb", "notebooks/{}.kernel.log")),
    ("reference", ok, ("results/{}.json",)),
):
    files = [run / m.format(n) for n, run in names if run for m in members]
    files = [f for f in files if f.is_file()]
    if not files:
        continue
    with tempfile.NamedTemporaryFile(dir=out, prefix=".", suffix=".tar.gz", delete=False) as f:
        with tarfile.open(f.name, "w:gz") as tar:
            for path in files:
                tar.add(path, arcname=path.name)
    os.chmod(f.name, 0o644)
    Path(f.name).replace(out / f"{kind}-{tag}.tar.gz")

# One report of the call's notebooks (copies of the suite's own, HTML included: no re-rendering).
for sub in ("results", "notebooks"):
    (combined / sub).mkdir(parents=True, exist_ok=True)
for name, run in ok + failed:
    for src in [run / "results" / f"{name}.json"] if run else []:
        if src.is_file():
            shutil.copy2(src, combined / "results" / src.name)
    for suffix in (".ipynb", ".html"):
        src = run / "notebooks" / f"{name}{suffix}" if run else None
        if src and src.is_file():
            shutil.copy2(src, combined / "notebooks" / src.name)
log = {
    "profile": "gpu",
    "profile_reason": "bash scripts/gpu_reference_run.sh all",
    "run": combined.name,
    "state": "interrupted" if stopped else "running" if state == "running" else "finished",
    "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)),
    **({} if state == "running" else {"ended": time.strftime("%Y-%m-%d %H:%M:%S")}),
    "notebooks": {
        n: {k: r["runs"][0][k] for k in ("status", "seconds", "error") if k in r["runs"][0]}
        for n, r in notebooks.items()
    },
    "not_run": not_run + to_run,
    **({"stopped_by": stopped} if stopped else {}),
}
paths.write_atomic(combined / "run.json", json.dumps(log, indent=1))
try:
    from helpers.suite import report

    report.write(combined)
    put(f"report-{tag}.md", (combined / "report.md").read_bytes())
except Exception as e:  # noqa: BLE001 - the seconds and tarballs are already out
    print(f"== report not written: {type(e).__name__}: {e}", file=sys.stderr)

capstone = [run / "results" / f"{n}.json" for n, run in ok if n.startswith("19_") and run]
if capstone and capstone[0].is_file():
    recorded = json.loads(capstone[0].read_text())
    if "waterfall" in recorded:
        from benchmarks.capstone import bench_rows, table

        put(f"bench_capstone-{tag}.md", table(bench_rows(recorded)) + "\n")
    elif state != "running":
        print("== notebook 19 recorded no waterfall: no capstone table")
print(f"== packed: {len(ok)} ok, {len(failed)} failed, {len(not_run)} not run"
      + (f", {len(to_run)} to run" if to_run else ""))
PYEOF
}

rc=0
case "$SUB" in
    all)
        run_all
        if [ -n "$STOPPED" ]; then
            rc=$(stop_status)
        else
            rc=$(FTG_SECONDS="$OUT/seconds-$TAG.json" "$PY" -c 'import json, os
d = json.load(open(os.environ["FTG_SECONDS"]))
bad = [n for n, r in d["notebooks"].items() if r["runs"][0]["status"] != "ok"]
print(1 if bad or d["not_run"] else 0)' 2>/dev/null || echo 1)
        fi
        ;;
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
[ -z "$STOPPED" ] || rc=$(stop_status)

echo
echo "== files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
if [ "$SUB" = all ]; then
    cat <<EOF
== NEXT, on the development machine, in the repository root: seconds-$TAG.json holds each
   notebook's seconds, alone on the GPU (catalog.toml's measured figures come from it once it
   is committed), and the notebooks not run and why:
   mkdir -p results/reference/<date>_<gpu>/gpu
   cp <this output folder>/seconds-$TAG.json results/reference/<date>_<gpu>/gpu/seconds.json
   tar -xzf <this output folder>/reference-$TAG.tar.gz -C results/reference/<date>_<gpu>/gpu
   failed-$TAG.tar.gz holds the executed copies and kernel logs of the notebooks that failed.
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
if [ -n "$STOPPED" ]; then
    echo "== $PROG: stopped by SIG$STOPPED (exit status $rc); what finished is packed in $OUT"
elif [ "$rc" -ne 0 ] && [ "$SUB" = all ]; then
    echo "== $PROG: some notebooks failed or were not run (seconds-$TAG.json says which)"
elif [ "$rc" -ne 0 ]; then
    echo "== $PROG: the step failed (exit status $rc); see $TAG.log"
fi
exit "$rc"
