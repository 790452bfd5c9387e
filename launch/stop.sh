#!/usr/bin/env bash
# Stop a run on all of its nodes (SIGTERM, the recipe's grace for the pre-emption save, then SIGKILL; Slurm: the job's
# steps first). The run is named, never guessed:
#   launch/stop.sh RUN_DIR | RUN_ID                                                   (launch/stop.py)
exec bash "$(dirname "${BASH_SOURCE[0]}")/shim.sh" stop "$@"
