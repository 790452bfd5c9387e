#!/usr/bin/env bash
# Check a cluster before committing it to a run, and start nothing (except the optional communication check).
#   launch/preflight.sh RECIPE --hostfile FILE [options] [--comm-check] [-- section.key=value ...]  (launch/preflight.py)
exec bash "$(dirname "${BASH_SOURCE[0]}")/shim.sh" preflight "$@"
