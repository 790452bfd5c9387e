#!/usr/bin/env bash
# Creates .venv (once), installs the pinned requirements, then this repository itself (editable: `pip install -e .`,
# which also puts the `llm-recipes` and `data-prep` commands in .venv/bin). Idempotent: a rerun only checks.
# torch goes first on its own so that DeepSpeed's build sees it; on a GPU cluster set TORCH_SPEC to the CUDA build,
# e.g. TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.requirements.sha
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install -q $TORCH_SPEC
  .venv/bin/python -m pip install -q -r requirements.txt
  # --no-deps: requirements.txt already pinned every dependency; this only links the checkout into the venv.
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
