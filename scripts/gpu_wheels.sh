#!/usr/bin/env bash
# Fetch the wheels an offline GPU node lacks (scripts/gpu_wheels.txt) into .whl/, by default for
# Python 3.12 on x86-64 Linux. Run HERE (a machine that reaches the package index), in the
# repository root:
#
#     bash scripts/gpu_wheels.sh
#     FTG_WHEELS_PYTHON=3.11 FTG_WHEELS_ARCH=aarch64 bash scripts/gpu_wheels.sh   # another node
#
# They must be the node's python3 and machine: scripts/gpu_reference_run.sh checks the wheels'
# tags against them before it installs anything.
# Then copy the repository with .whl/ to the node and run scripts/gpu_reference_run.sh there
# (DEVELOPERS.md, "Reference runs on an offline GPU node"). .whl/ is ignored by git.
set -euo pipefail

cd "$(dirname "$0")/.."
LIST=scripts/gpu_wheels.txt
DEST=.whl
LIMIT_MIB=64  # keep the copy sent to the node small: working tree + wheels
PYVER=${FTG_WHEELS_PYTHON:-3.12}  # the node's python3
ARCH=${FTG_WHEELS_ARCH:-x86_64}   # and its machine (uname -m)

die() { echo "gpu_wheels.sh: $*" >&2; exit 1; }

# Any Python with pip will do: --python-version/--platform make pip pick the node's manylinux wheels.
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for cand in .venv/bin/python python3 python; do
        if "$cand" -m pip --version >/dev/null 2>&1; then PY=$cand; break; fi
    done
fi
[ -n "$PY" ] || die "no Python with pip found (set PYTHON=/path/to/python)"
[ -f "$LIST" ] || die "$LIST is missing"
[[ $PYVER =~ ^3\.[0-9]+$ ]] || die "FTG_WHEELS_PYTHON must be a version such as 3.12, got '$PYVER'"
case "$ARCH" in
    x86_64 | aarch64) ;;
    *) die "FTG_WHEELS_ARCH must be x86_64 or aarch64, got '$ARCH'" ;;
esac

mapfile -t PINS < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$LIST" | grep -v '^$')
[ "${#PINS[@]}" -gt 0 ] || die "$LIST names no wheels"
for pin in "${PINS[@]}"; do
    [[ $pin =~ ^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+$ ]] \
        || die "$LIST: '$pin' is not of the form name==version"
done

# Download into a fresh folder and swap it in only when every wheel came: a stale wheel of
# another version left in .whl/ would make the install there fail ("two versions").
TMP=$(mktemp -d "${DEST}.tmp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
echo "Downloading ${#PINS[@]} wheels for CPython $PYVER manylinux $ARCH with $PY ..."
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$PYVER" --implementation cp \
    --platform "manylinux_2_28_$ARCH" --platform "manylinux_2_27_$ARCH" \
    --platform "manylinux_2_24_$ARCH" --platform "manylinux_2_17_$ARCH" \
    --platform "manylinux2014_$ARCH" --platform "manylinux1_$ARCH" \
    -d "$TMP" "${PINS[@]}"

count=$(find "$TMP" -maxdepth 1 -name '*.whl' | wc -l)
[ "$count" -eq "${#PINS[@]}" ] \
    || die "expected ${#PINS[@]} wheels, got $count in $TMP: $(ls "$TMP")"
rm -rf "$DEST"
mv "$TMP" "$DEST"
trap - EXIT

whl_bytes=$(du -cb "$DEST"/*.whl | tail -n1 | cut -f1)
# What else a copy of the repository holds: tracked files and untracked files git does not ignore.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard 2>/dev/null \
    | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
ls -l "$DEST"
echo "$count wheels in $DEST/: $(mib "$whl_bytes") MiB"
echo "with the working tree ($(mib "$tree_bytes") MiB) the copy for the node is" \
     "$(mib $((whl_bytes + tree_bytes))) MiB (kept under $LIMIT_MIB MiB)"
if [ $((whl_bytes + tree_bytes)) -gt $((LIMIT_MIB * 1048576 * 9 / 10)) ]; then
    die "that is within 10% of the $LIMIT_MIB MiB limit: remove large untracked files first"
fi
echo "next: copy the repository with .whl/ to the GPU node; there: bash scripts/gpu_reference_run.sh --out DIR check"
