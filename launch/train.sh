#!/usr/bin/env bash
# Start a training run on the hosts of a DeepSpeed-style hostfile, supervise it, and stop every rank on every node
# when any rank dies (naming the first failing rank and host) or the job hangs; with restarts allowed it starts again
# from the newest complete checkpoint, on a spare host instead of one that failed twice. --help lists the options.
#   launch/train.sh RECIPE [--hostfile FILE] [options] [-- section.key=value ...]      (launch/train.py)
exec bash "$(dirname "${BASH_SOURCE[0]}")/shim.sh" train "$@"
