#!/usr/bin/env bash
# Stop a run on all of its nodes: SIGTERM to every process that carries the run's LAUNCH_RUN_ID, SIGKILL to what is
# left after a grace period. For a Slurm run, scancel.
#   launch/stop.sh [RUN_DIR | RUN_ID]     (default: the newest run under runs/launch/)
#   launch/stop.sh --local RUN_ID         (what runs on each node)
#   launch/stop.sh --signal-local SIG RUN_ID PID...   (on a node: signal those processes of the run; stack dumps)
# Grace between SIGTERM (the ranks save a checkpoint and exit) and SIGKILL: LAUNCH_STOP_GRACE if set, else the
# recipe's checkpoint.stop_grace_seconds (kept by train.sh in RUN_DIR/stop_grace), else 10 s.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
GRACE=${LAUNCH_STOP_GRACE:-10}

stop_local() {  # every process on this node started for run $1, except this script
  local id=$1 pids
  find_pids() { grep -lsxzF "LAUNCH_RUN_ID=$id" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | grep -vx "$$" || true; }
  pids=$(find_pids)
  [ -n "$pids" ] || { echo "$(hostname): no processes of run $id"; return 0; }
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null
  local end=$((SECONDS + GRACE))
  while [ -n "$(find_pids)" ] && [ $SECONDS -lt $end ]; do sleep 0.2; done
  pids=$(find_pids)
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
  echo "$(hostname): stopped run $id"
}

if [ "${1:-}" = --signal-local ]; then  # --signal-local SIG RUN_ID PID...: the hang watchdog's stack-dump request
  [[ ${2:-} =~ ^[A-Z0-9]+$ ]] && [ -n "${3:-}" ] || die "usage: stop.sh --signal-local SIG RUN_ID PID..." 2
  sig=$2 id=$3
  shift 3
  for pid in "$@"; do  # only processes of this run: a pid from a heartbeat file may have been reused since
    [[ $pid =~ ^[0-9]+$ ]] && grep -qsxzF "LAUNCH_RUN_ID=$id" "/proc/$pid/environ" &&
      kill "-$sig" "$pid" 2>/dev/null && echo "$(hostname): SIG$sig to pid $pid of run $id"
  done
  exit 0
fi
if [ "${1:-}" = --local ]; then
  [ -n "${2:-}" ] || die "usage: stop.sh --local RUN_ID" 2
  stop_local "$2"
  exit 0
fi
case "${1:-}" in -h|--help) sed -n '2,8p' "$0"; exit 0 ;; esac

target=${1:-}
if [ -z "$target" ]; then
  target=$(ls -1dt "$REPO_DIR"/runs/launch/*/ 2>/dev/null | head -n1) || true
  [ -n "$target" ] || die "no runs under $REPO_DIR/runs/launch; pass the run directory or id"
fi
[ -d "$target" ] || target=$REPO_DIR/runs/launch/$target
[ -f "$target/hosts" ] || die "$target is not a run directory (no hosts file); pass the --log-dir of the run"
run_dir=$(cd "$target" && pwd)
run_id=$(sed -n 's/^LAUNCH_RUN_ID=//p' "$run_dir/launch.env")
if [ -z "${LAUNCH_STOP_GRACE:-}" ] && grep -qx '[0-9][0-9]*' "$run_dir/stop_grace" 2>/dev/null; then
  GRACE=$(cat "$run_dir/stop_grace")
fi
backend=$(cat "$run_dir/backend")
if [ -z "${LAUNCH_SSH_CONFIG:-}" ] && [ -s "$run_dir/ssh_config" ]; then LAUNCH_SSH_CONFIG=$(cat "$run_dir/ssh_config"); fi
setup_ssh

# So that the launcher reports a requested stop, not a failure (unless the launcher itself is stopping the run).
[ -n "${LAUNCH_STOP_BY_LAUNCHER:-}" ] || date +%s >"$run_dir/stop_requested"
if [ -f "$run_dir/slurm_job_id" ]; then
  scancel "$(cat "$run_dir/slurm_job_id")" && echo "scancel $(cat "$run_dir/slurm_job_id")"
  rc=$?
  rm -f "$run_dir/secret.env"  # the job removes it only when it ends by itself
  exit $rc
fi
if [ "$backend" = local ]; then
  stop_local "$run_id"
  exit 0
fi
pids=()
while read -r host; do
  run_ssh "$host" "LAUNCH_STOP_GRACE=$GRACE bash $(printf %q "$LAUNCH_DIR/stop.sh") --local $(printf %q "$run_id")" &
  pids+=($!)
done <"$run_dir/hosts"
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
