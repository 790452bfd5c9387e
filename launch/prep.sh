#!/usr/bin/env bash
# Cluster data prep over a hostfile: node i of H tokenizes (or curates) its slice over ssh, then this machine merges
# the manifest. Rerunning the same command redoes only what is missing.
#   launch/prep.sh --hostfile FILE [--log-dir DIR] [--dry-run] -- [tokenize|curate] INPUTS... -o OUT [options]
exec bash "$(dirname "${BASH_SOURCE[0]}")/shim.sh" prep "$@"
