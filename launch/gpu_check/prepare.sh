#!/usr/bin/env bash
# Run on a CPU machine with pip and PyPI: download the wheels the GPU check needs that an image holding only
# Python 3.12 + torch lacks (launch/gpu_check/wheels.txt), for CPython 3.12 manylinux x86_64, plus DeepSpeed built
# from its sdist into a pure-python wheel (DS_BUILD_OPS=0: no op prebuilt), into a git-ignored folder that travels
# with the repository to the GPU machine (at most 64 MiB; this script fails above that).
#
#   launch/gpu_check/prepare.sh [WHEEL_DIR]        default WHEEL_DIR: .gpu_wheels (env GPU_WHEELS)
#
# For `run.sh --dry` on a machine whose Python is not 3.12 it also downloads, into WHEEL_DIR-dry (git-ignored, does
# not travel), the same versions of the ABI-bound wheels (numpy, pydantic-core, ...) for the local CPython.
# PYTHON (default .venv/bin/python) must have pip and torch: DeepSpeed's setup.py imports torch to build.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT="$(realpath -m "${1:-${GPU_WHEELS:-$REPO/.gpu_wheels}}")"
PY="${PYTHON:-$REPO/.venv/bin/python}"
DEEPSPEED="deepspeed==0.19.8"
[ -x "$PY" ] || PY="$(command -v python3)"
"$PY" -c "import torch" 2>/dev/null || { echo "error: $PY cannot import torch, which DeepSpeed's build needs; set PYTHON to an interpreter with torch (e.g. the repo's .venv/bin/python after launch/setup_env.sh)" >&2; exit 2; }

TMP="$OUT.tmp"
rm -rf "$TMP"
mkdir -p "$TMP"
echo "== cp312 manylinux wheels from $HERE/wheels.txt"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version 3.12 \
    --abi cp312 --abi abi3 --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -r "$HERE/wheels.txt" -d "$TMP"
echo "== $DEEPSPEED: sdist -> pure-python wheel (DS_BUILD_OPS=0)"
# From the sdist, never a prebuilt wheel a local index or pip's wheel cache may hold (--no-cache-dir): what travels
# is what this command builds. One pip call: a separate `pip download` of the sdist ran its setup.py once more.
DS_BUILD_OPS=0 "$PY" -m pip wheel --quiet --no-cache-dir --no-deps --no-binary :all: --no-build-isolation \
    "$DEEPSPEED" -w "$TMP"
"$PY" "$HERE/offline.py" check-tags "$TMP" --python 3.12
rm -rf "$OUT" && mv "$TMP" "$OUT"

LOCAL_ABI="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
if [ "$LOCAL_ABI" != cp312 ]; then
    echo "== $LOCAL_ABI twins of the ABI-bound wheels, for run.sh --dry here ($OUT-dry, does not travel)"
    rm -rf "$OUT-dry" && mkdir -p "$OUT-dry"
    "$PY" "$HERE/offline.py" twins "$OUT" > "$OUT-dry/twins.txt"
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: -r "$OUT-dry/twins.txt" -d "$OUT-dry"
fi

echo "== $OUT"
"$PY" "$HERE/offline.py" size "$OUT" --limit-mib 64
