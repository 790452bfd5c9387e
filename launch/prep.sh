#!/usr/bin/env bash
# Cluster data prep over a DeepSpeed-style hostfile ("host slots=N"): node i of H runs
#   python -m data_prep tokenize ARGS --slice i/H -j SLOTS
# over ssh (all nodes at once; the repo, its venv and the output directory must be on a shared file system), then this
# machine merges the per-unit stats into manifest.json (--merge-only) and lists any failed unit.
# Rerunning the same command redoes only what is missing. ssh honours LAUNCH_SSH_CONFIG like train.sh.
#
#   launch/prep.sh --hostfile FILE [--log-dir DIR] [--dry-run] -- INPUTS... -o OUT -t TOKENIZER [tokenize options]
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

HOSTFILE=${LAUNCH_HOSTFILE:-} LOG_DIR="" DRY_RUN=0 ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hostfile) HOSTFILE=$2; shift 2 ;;
    --log-dir) LOG_DIR=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    --) shift; ARGS=("$@"); break ;;
    *) die "unknown option $1 (tokenize arguments go after --)" 2 ;;
  esac
done
[ -n "$HOSTFILE" ] || die "no hostfile: pass --hostfile FILE (lines 'host slots=N')" 2
[ ${#ARGS[@]} -gt 0 ] || die "no tokenize arguments after -- (INPUTS... -o OUT -t TOKENIZER)" 2
[ -x "$PY" ] || die "$PY not found: run launch/setup_env.sh first" 2

mapfile -t NODES < <("$PY" "$LAUNCH_DIR/hostfile.py" plan "$HOSTFILE") || die "bad hostfile $HOSTFILE" 2
H=${#NODES[@]}
[ "$H" -gt 0 ] || die "hostfile $HOSTFILE lists no hosts" 2
LOG_DIR=${LOG_DIR:-$REPO_DIR/runs/prep/$(date +%Y%m%d-%H%M%S)}
QUOTED=$(printf '%q ' "${ARGS[@]}")
setup_ssh

# Relative paths in ARGS mean the same on every node: each runs in this directory (shared file system). The venv's
# python finds data_prep because the repo is installed in it (pip install -e .): no PYTHONPATH needed.
WORKDIR=$PWD
# LAUNCH_RUN_ID marks every process of this prep on every node, so that stop.sh --local can find them.
PREP_ID=prep-$(date +%Y%m%d-%H%M%S)-$$
cmd_for() {  # slice index, slots
  printf 'cd %q && OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false LAUNCH_RUN_ID=%q %q -m data_prep tokenize %s--slice %d/%d -j %d -q' \
    "$WORKDIR" "$PREP_ID" "$PY" "$QUOTED" "$1" "$H" "$2"
}

if [ "$DRY_RUN" = 1 ]; then
  i=0
  for line in "${NODES[@]}"; do
    read -r host slots _ <<<"$line"
    echo "$host: $(cmd_for "$i" "$slots")"
    i=$((i + 1))
  done
  echo "local: $PY -m data_prep tokenize ${QUOTED}--merge-only"
  exit 0
fi

mkdir -p "$LOG_DIR"
say "data prep on $H node(s); logs in $LOG_DIR"
# Ctrl-C, kill or a closed terminal stop the tokenize processes on every node too: left running, they would go on
# writing while a rerun deletes their .tmp files.
stop_nodes() {
  local line host p=()
  for line in "${NODES[@]}"; do
    read -r host _ <<<"$line"
    run_ssh "$host" "bash $(printf %q "$LAUNCH_DIR/stop.sh") --local $(printf %q "$PREP_ID")" >/dev/null 2>&1 &
    p+=($!)
  done
  wait "${p[@]}" || true
}
trap 'say "interrupted: stopping data prep on all nodes"; stop_nodes; exit 130' INT TERM HUP
pids=() hosts=()
i=0
for line in "${NODES[@]}"; do
  read -r host slots _ <<<"$line"
  run_ssh "$host" "$(cmd_for "$i" "$slots")" >"$LOG_DIR/prep_${i}_${host}.log" 2>&1 &
  pids+=($!) hosts+=("$host")
  i=$((i + 1))
done
failed=0
for k in "${!pids[@]}"; do
  if ! wait "${pids[$k]}"; then
    say "node ${hosts[$k]} (slice $k/$H) failed: see $LOG_DIR/prep_${k}_${hosts[$k]}.log"
    tail -n 5 "$LOG_DIR/prep_${k}_${hosts[$k]}.log" >&2 || true
    failed=1
  fi
done
# One global manifest from the per-unit stats; lists the units still missing (and why) if any.
if ! "$PY" -m data_prep tokenize "${ARGS[@]}" --merge-only -q; then
  say "some units are not complete; rerun the same command to redo only those"
  exit 1
fi
[ "$failed" = 0 ] || exit 1
say "done: manifest.json written"
