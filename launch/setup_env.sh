#!/usr/bin/env bash
# Creates .venv (once), installs the pinned requirements, then this repository itself (editable: `pip install -e .`,
# which also puts the `llm-recipes` and `data-prep` commands in .venv/bin). Idempotent: a rerun only checks.
# torch goes first on its own so that DeepSpeed's build sees it; on a GPU cluster set TORCH_SPEC to the CUDA build,
# e.g. TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130".
# TORCH_SPEC=skip keeps the interpreter's own torch (a container image's, e.g. NGC PyTorch: built for its CUDA and
# NCCL): the venv sees the system site-packages, torch is not installed, and a constraint on the version found stops
# pip from replacing it (a requirement that needs another torch fails instead). launch/container/Dockerfile uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
MIN_TORCH=2.6  # pyproject.toml's range
venv_opts=()
if [ "$TORCH_SPEC" = skip ]; then
  if ! have=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
    echo "setup_env: TORCH_SPEC=skip but $PY cannot import torch: run it with the interpreter that has torch" \
      "(PYTHON=...), or give TORCH_SPEC a torch to install" >&2
    exit 2
  fi
  # 2.6.0a0+ecf3bae.nv25.01 -> 2.6: NGC builds carry pre-release and local tags
  if ! "$PY" -c 'import re, sys; v, m = (tuple(map(int, re.match(r"(\d+)\.(\d+)", s).groups())) for s in sys.argv[1:]); sys.exit(v < m)' "$have" "$MIN_TORCH"; then
    echo "setup_env: TORCH_SPEC=skip but $PY has torch $have, older than the $MIN_TORCH this project needs: use a" \
      "newer image, or give TORCH_SPEC a torch to install" >&2
    exit 2
  fi
  venv_opts=(--system-site-packages)
fi
[ -x .venv/bin/python ] || "$PY" -m venv "${venv_opts[@]}" .venv
stamp=.venv/.requirements.sha
if [ "$TORCH_SPEC" = skip ]; then
  want=$(cat requirements.txt pyproject.toml <(echo "torch skipped: $have") | sha256sum | cut -d' ' -f1)
else
  want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  if [ "$TORCH_SPEC" = skip ]; then
    pins=$(mktemp -d)
    trap 'rm -rf "$pins"' EXIT
    grep -v '^torch==' requirements.txt >"$pins/requirements.txt"
    echo "torch==$have" >"$pins/constraints.txt"
    echo "setup_env: keeping the image's torch $have"
    .venv/bin/python -m pip install -q -r "$pins/requirements.txt" -c "$pins/constraints.txt"
  else
    # shellcheck disable=SC2086
    .venv/bin/python -m pip install -q $TORCH_SPEC
    .venv/bin/python -m pip install -q -r requirements.txt
  fi
  # --no-deps: requirements.txt already pinned every dependency; this only links the checkout into the venv.
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
# Byte-compile this checkout's own modules (pip compiles what it installs, not an editable checkout): every rank, CLI
# and worker imports ~200 of them, and where the environment sets PYTHONDONTWRITEBYTECODE nothing would ever cache
# them (~0.1 s of CPU per process start). Sources newer than their .pyc are recompiled on import as usual.
.venv/bin/python -m compileall -q -j 0 recipes data_prep launch tests/support >/dev/null
# Compile the curation kernels (numba, cached beside data_prep/steps/kernels.py) now, once per checkout, instead of
# in the first curation run or test (~15 s of CPU); with the cache in place this takes about a second.
.venv/bin/python -c 'from data_prep.steps import kernels; kernels.warm_up()'
