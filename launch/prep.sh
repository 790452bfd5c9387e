#!/usr/bin/env bash
# Cluster data prep over a DeepSpeed-style hostfile ("host slots=N"): node i of H runs
#   python -m data_prep tokenize ARGS --slice i/H -j SLOTS        (or: curate ARGS, after "-- curate")
# over ssh (all nodes at once; the repo, its venv and the output directory must be on a shared file system), then this
# machine merges the per-unit stats into manifest.json (--merge-only) and lists any failed unit.
# With curation steps (curate, tokenize --steps) the dedup passes are global: each stage (hash, buckets, filter) runs
# on every node with --stage, and the next starts only when all nodes finished it; a failed stage ends the run.
# Rerunning the same command redoes only what is missing. ssh honours LAUNCH_SSH_CONFIG like train.sh.
#
#   launch/prep.sh --hostfile FILE [--log-dir DIR] [--dry-run] -- [tokenize|curate] INPUTS... -o OUT [options]
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

HOSTFILE=${LAUNCH_HOSTFILE:-} LOG_DIR="" DRY_RUN=0 ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hostfile) HOSTFILE=$2; shift 2 ;;
    --log-dir) LOG_DIR=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    --) shift; ARGS=("$@"); break ;;
    *) die "unknown option $1 (tokenize arguments go after --)" 2 ;;
  esac
done
[ -n "$HOSTFILE" ] || die "no hostfile: pass --hostfile FILE (lines 'host slots=N')" 2
CMD=tokenize
case "${ARGS[0]:-}" in tokenize|curate) CMD=${ARGS[0]}; ARGS=("${ARGS[@]:1}") ;; esac
[ ${#ARGS[@]} -gt 0 ] || die "no $CMD arguments after -- (INPUTS... -o OUT -t TOKENIZER, or curate INPUTS... -o OUT --steps FILE)" 2
# The curation passes are global (every unit's hashes before any bucket, every bucket before any filter): one stage
# at a time over all nodes. Without steps: one plain stage.
STAGES=("")
for a in "$CMD" "${ARGS[@]}"; do
  case "$a" in curate|--steps|--steps=*) STAGES=(hash buckets filter) ;; esac
done
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
cmd_for() {  # slice index, slots, stage ("" = no --stage)
  printf 'cd %q && OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false LAUNCH_RUN_ID=%q %q -m data_prep %s %s--slice %d/%d %s-j %d -q' \
    "$WORKDIR" "$PREP_ID" "$PY" "$CMD" "$QUOTED" "$1" "$H" "${3:+--stage $3 }" "$2"
}

if [ "$DRY_RUN" = 1 ]; then
  for stage in "${STAGES[@]}"; do
    [ -z "$stage" ] || echo "# stage $stage: on every node, then wait for all"
    i=0
    for line in "${NODES[@]}"; do
      read -r host slots _ <<<"$line"
      echo "$host: $(cmd_for "$i" "$slots" "$stage")"
      i=$((i + 1))
    done
  done
  echo "local: $PY -m data_prep $CMD ${QUOTED}--merge-only"
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
run_stage() {  # stage ("" = plain slices): every node runs its slice; returns 1 if any node failed
  local stage=$1 line host slots i=0 k log failed=0 pids=() logs=() hosts=()
  [ -z "$stage" ] || say "stage $stage on $H node(s)"
  for line in "${NODES[@]}"; do
    read -r host slots _ <<<"$line"
    log="$LOG_DIR/prep_${stage:+${stage}_}${i}_${host}.log"
    run_ssh "$host" "$(cmd_for "$i" "$slots" "$stage")" >"$log" 2>&1 &
    pids+=($!) logs+=("$log") hosts+=("$host")
    i=$((i + 1))
  done
  for k in "${!pids[@]}"; do
    if ! wait "${pids[$k]}"; then
      say "node ${hosts[$k]} (slice $k/$H${stage:+, stage $stage}) failed: see ${logs[$k]}"
      tail -n 5 "${logs[$k]}" >&2 || true
      failed=1
    fi
  done
  return "$failed"
}
failed=0
for stage in "${STAGES[@]}"; do
  if ! run_stage "$stage"; then
    failed=1
    # a later stage needs this one complete on every node: stop here (what finished is kept for the rerun)
    [ -z "$stage" ] || { say "stage $stage failed: the later stages were not started"; break; }
  fi
done
# One global manifest from the per-unit stats; lists the units still missing (and why) if any.
if ! "$PY" -m data_prep "$CMD" "${ARGS[@]}" --merge-only -q; then
  say "some units are not complete; rerun the same command to redo only those"
  exit 1
fi
[ "$failed" = 0 ] || exit 1
say "done: $([ "$CMD" = curate ] && echo curation.json || echo manifest.json) written"
