#!/usr/bin/env bash
# The GPU check, for a machine with one GPU, Python 3.12 + torch and no network (run launch/gpu_check/prepare.sh
# first, on a machine with PyPI; its wheel folder travels with the repository):
#
#   launch/gpu_check/run.sh OUTDIR          install the wheels offline into a temporary target, then within the
#                                           budget (GPU_CHECK_BUDGET_S, default 480 s) run tests/gpu, bench_train on
#                                           the 1.3B GPT at micro-batch 4/8/16 and megatron-core vs plain PyTorch;
#                                           writes OUTDIR/gpu_check.json, run.log, profile.txt
#   launch/gpu_check/run.sh --dry OUTDIR    on a CPU machine: the same install and the same stages (tiny recipe,
#                                           two steps) in a clean venv that sees only torch and the wheels, so a
#                                           missing wheel fails here, not on the GPU machine
#
# GPU_WHEELS (default .gpu_wheels) is the wheel folder; PYTHON the interpreter (default python3; --dry: the one
# that has torch, default .venv/bin/python). Exit 0 only when every stage passed.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DRY=0
if [ "${1:-}" = "--dry" ]; then DRY=1; shift; fi
[ $# -eq 1 ] || { echo "usage: $0 [--dry] OUTDIR" >&2; exit 2; }
OUT="$(realpath -m "$1")"
WHEELS="$(realpath -m "${GPU_WHEELS:-$REPO/.gpu_wheels}")"
ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "error: no wheels in $WHEELS; run launch/gpu_check/prepare.sh on a machine with PyPI and bring $WHEELS along" >&2; exit 2; }
mkdir -p "$OUT"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
exec > >(tee -a "$OUT/run.log") 2>&1
export GPU_CHECK_LOG_TEED=1  # gpu_check.py's own lines reach run.log through this tee
echo "== gpu_check $(date -u +%FT%TZ) dry=$DRY wheels=$WHEELS out=$OUT"

install_wheels() {  # PY TARGET WHEEL...: offline, no dependency resolution (the folder is the complete list)
    local py="$1" target="$2"; shift 2
    if "$py" -m pip --version >/dev/null 2>&1; then
        # --no-compile: the first import compiles (and caches) only what runs; pip compiled every module of the folder
        # (26 MiB of wheels: 14 s against 3.4 s)
        "$py" -m pip install --quiet --no-index --no-deps --no-compile --disable-pip-version-check \
            --target "$target" "$@"
    else  # an image without pip: wheels are zip files
        "$py" "$HERE/offline.py" install "$@" --target "$target"
    fi
}

# A venv's .pth file names the places its python imports from (the repo, uninstalled, and the wheel target): no
# PYTHONPATH, and nothing written outside WORK.
venv_seeing() {  # BASE_PY VENV DIR...: a venv without pip (needs no ensurepip) whose site also holds DIR...
    local base="$1" venv="$2"; shift 2
    "$base" -m venv --without-pip ${VENV_SYSTEM_SITE:+--system-site-packages} "$venv"
    local site
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    printf '%s\n' "$@" > "$site/gpu_check.pth"
}

if [ "$DRY" = 0 ]; then
    PY="${PYTHON:-python3}"
    "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())'
    install_wheels "$PY" "$WORK/site" "$WHEELS"/*.whl
    VENV_SYSTEM_SITE=1 venv_seeing "$PY" "$WORK/venv" "$REPO" "$WORK/site"  # the image's torch stays visible
    "$WORK/venv/bin/python" "$HERE/gpu_check.py" "$OUT" --budget-s "${GPU_CHECK_BUDGET_S:-480}"
    exit 0
fi

# ---- dry mode -------------------------------------------------------------------------------------------------
HOST_PY="${PYTHON:-$REPO/.venv/bin/python}"
"$HOST_PY" -c "import torch" 2>/dev/null || { echo "error: --dry needs an interpreter with torch (PYTHON=..., default .venv/bin/python): it stands in for the GPU image's torch" >&2; exit 2; }
echo "== 1. the wheel folder installs on CPython 3.12 manylinux x86_64 (tags)"
"$HOST_PY" "$HERE/offline.py" check-tags "$WHEELS" --python 3.12
PY312=""
for c in $(command -v python3.12 || true) "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    if [ -x "$c" ] && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then PY312="$c"; break; fi
done  # (a pyenv shim exists even where 3.12 is not selected: run it to be sure)
if [ -n "$PY312" ]; then
    echo "== 2. a clean Python 3.12 venv ($PY312): offline install, then every module that needs no torch imports"
    install_wheels "$PY312" "$WORK/site312" "$WHEELS"/*.whl
    venv_seeing "$PY312" "$WORK/venv312" "$WORK/site312"
    "$WORK/venv312/bin/python" -c '
import importlib
mods = "numpy yaml pydantic pydantic_core hjson msgpack psutil cpuinfo einops tqdm packaging pytest pytest_timeout pygments".split()
for m in mods:
    importlib.import_module(m)
print(len(mods), "modules import on Python 3.12 from the wheel folder alone")'
else
    echo "== 2. skipped: no Python 3.12 here (the tag check above stands in for it)"
fi
BASE="$("$HOST_PY" -c 'import sys; print(sys._base_executable)')"
ABI="$("$BASE" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
echo "== 3. a clean venv of $BASE ($ABI) that sees only torch (+ its requirements) and the wheels: the GPU path runs"
echo "torch image:" $("$HOST_PY" "$HERE/offline.py" torch-view "$WORK/torch_image")
SET=()
for w in "$WHEELS"/*.whl; do
    case "$(basename "$w")" in
        *-cp312-cp312-*) if [ "$ABI" = cp312 ]; then SET+=("$w"); fi ;;  # else replaced by its twin below
        *) SET+=("$w") ;;
    esac
done
if [ "$ABI" != cp312 ]; then
    ls "$WHEELS-dry"/*.whl >/dev/null 2>&1 || { echo "error: no $ABI twins in $WHEELS-dry; run launch/gpu_check/prepare.sh here" >&2; exit 2; }
    SET+=("$WHEELS-dry"/*.whl)
fi
install_wheels "$HOST_PY" "$WORK/site" "${SET[@]}"
# The repo, the installed wheels and the torch image, nothing else (the user site and the dev venv stay out of sight).
venv_seeing "$BASE" "$WORK/venv" "$REPO" "$WORK/site" "$WORK/torch_image"
export PYTHONNOUSERSITE=1 CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
"$WORK/venv/bin/python" "$HERE/gpu_check.py" "$OUT" --dry --budget-s "${GPU_CHECK_BUDGET_S:-480}"
