#!/usr/bin/env bash
# The end of every shim (train.sh, preflight.sh, stop.sh, prep.sh): `python -m launch COMMAND ARGS...` with the venv's
# Python and this checkout's launch package, from the caller's directory (relative paths keep their meaning).
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${LAUNCH_VENV:-$repo/.venv}/bin/python
[ -x "$py" ] || { echo "[launch] error: no Python at $py; run launch/setup_env.sh (or set LAUNCH_VENV)" >&2; exit 1; }
exec "$py" -c 'import sys; sys.path[0] = sys.argv.pop(1); from launch.cli import main; sys.exit(main())' "$repo" "$@"
