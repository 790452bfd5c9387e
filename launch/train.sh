#!/usr/bin/env bash
# Start a training run on the hosts of a DeepSpeed-style hostfile, supervise it, and stop every rank on every node
# when any rank dies (exit code non-zero, naming the first failing rank and host) or the job hangs (no rank advances
# for supervision.hang_timeout_seconds: every rank's stack is dumped first). With restarts allowed (--max-restarts,
# supervision.max_restarts) the whole job then starts again from the newest complete checkpoint, after a back-off,
# on a spare host instead of one that failed twice (--spares); each restart is one line of LOG_DIR/restarts.jsonl.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# shellcheck disable=SC2154  # usage_common comes from lib.sh
usage() {
  cat >&2 <<EOF
usage: launch/train.sh RECIPE [--hostfile FILE] [options] [-- section.key=value ...]
$usage_common
  --version                print the llm-recipes version and exit
  --no-preflight           skip the ssh/repo reachability check of every node
  --quiet                  write rank output to the logs only, not to the terminal
  --max-restarts N         restart the job from the newest complete checkpoint after a failure or a hang, up to N
                           times (default: the recipe's supervision.max_restarts); not with --backend slurm
  --spares K               keep the last K hosts of the selection out of the world: a host that failed twice is
                           replaced by a spare with the same slots; with none left the run stops
environment: LAUNCH_SSH_CONFIG (ssh_config file for aliases/ports/keys), LAUNCH_EXPORT, LAUNCH_STOP_GRACE (s; default: the
  recipe's checkpoint.stop_grace_seconds), LAUNCH_SLURM_GRACE (s, 300: a Slurm job saves and requeues itself this long
  before its time limit)
EOF
}

QUIET=0 MAX_RESTARTS_OPT="" SPARES_N=0
args=()
while [ $# -gt 0 ]; do  # this script's own options (before --); the rest are the common ones of lib.sh
  case "$1" in
    --) args+=("$@"); break ;;
    --version) exec "$PY" -m recipes --version ;;
    --quiet) QUIET=1; shift ;;
    --max-restarts) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--max-restarts '${2:-}': give the number of restarts allowed (0 or more)" 2
      MAX_RESTARTS_OPT=$2; shift 2 ;;
    --spares) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--spares '${2:-}': give how many hosts at the end of the selection to keep as spares" 2
      SPARES_N=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
parse_args "${args[@]}"
check_env
setup_ssh
plan_nodes
if [ "$BACKEND" = slurm ] && { [ -n "$MAX_RESTARTS_OPT" ] || [ "$SPARES_N" -gt 0 ]; }; then
  die "--max-restarts and --spares are for the local, torchrun-ssh and deepspeed back ends; under Slurm the job requeues itself (scontrol requeue, or a node failure) and Slurm picks the nodes: drop these options" 2
fi
split_spares
check_layout
FACTS=$(cd "$REPO_DIR" && "$PY" "$LAUNCH_DIR/layout_check.py" --facts "$RECIPE" "$WORLD_SIZE" "${OVERRIDES[@]}") || exit 3
fact() { sed -n "s/^$1=//p" <<<"$FACTS"; }
DEVICE=$(fact device) CKPT_DIR=$(fact checkpoint_dir)
MAX_RESTARTS=${MAX_RESTARTS_OPT:-$(fact max_restarts)}
BACKOFF_S=$(fact restart_backoff_seconds) BACKOFF_MAX_S=$(fact restart_backoff_max_seconds)
HANG_TIMEOUT_S=$(fact hang_timeout_seconds)
if [ "$BACKEND" = slurm ]; then
  SLURM_GRACE=${LAUNCH_SLURM_GRACE:-300}
  [[ $SLURM_GRACE =~ ^[0-9]+$ ]] || die "LAUNCH_SLURM_GRACE='$SLURM_GRACE': give the seconds before the time limit at which the job saves and requeues itself" 2
fi
RUN_ID=${RUN_ID:-$(basename "${RECIPE%.*}" | tr -c 'A-Za-z0-9._\n-' _)-$(date +%Y%m%d-%H%M%S)-$$}
[[ $RUN_ID =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "--run-id '$RUN_ID': use letters, digits, '.', '_' and '-' only" 2
MASTER_PORT_OPT=$MASTER_PORT
[ -n "$MASTER_PORT" ] || pick_master_port
LOG_DIR=${LOG_DIR:-$REPO_DIR/runs/launch/$RUN_ID}
mkdir -p "$LOG_DIR" || die "cannot create the log dir $LOG_DIR"
LOG_DIR=$(cd "$LOG_DIR" && pwd)
SECRET_NAMES=$(secret_env_names)
SECRET_ENV=""
[ -z "$SECRET_NAMES" ] || SECRET_ENV=$LOG_DIR/secret.env
write_env_file "$SECRET_ENV" >"$LOG_DIR/launch.env" || exit $?
rank_command
if [ "$BACKEND" = deepspeed ]; then
  # DeepSpeed's runner sends one environment to all nodes: each rank finds its host's name by node index in this list.
  echo "LAUNCH_HOSTS=${HOSTS[*]}" >>"$LOG_DIR/launch.env"
  # Its pdsh runner pastes the program's arguments into a remote shell line ("a b" in double quotes, the rest bare),
  # so an override like name=it's $(cmd) would break it or run cmd. The per-rank command travels as shell-quoted
  # words in the environment instead; rank_exec.sh, the only argument DeepSpeed sees, runs them.
  echo "LAUNCH_RANK_CMD=$(quote_words "${RANK_CMD[@]:1}")" >>"$LOG_DIR/launch.env"
fi
NNODES=${#HOSTS[@]}

# Per attempt: its number (1, 2, ...), and where the ranks write their heartbeats and, on SIGUSR2, their stacks (recipes/train/heartbeat.py).
attempt_env() { [ -z "${ATTEMPT_DIR:-}" ] || printf 'LAUNCH_ATTEMPT=%s\nLAUNCH_HEARTBEAT_DIR=%s\nLAUNCH_STACKS_DIR=%s\n' "$ATTEMPT" "$ATTEMPT_DIR/heartbeat" "$ATTEMPT_DIR/stacks"; }
env_words() { local line; while IFS= read -r line; do printf '%q ' "$line"; done < <(cat "$LOG_DIR/launch.env"; attempt_env); }

# --- the command per node, for each back end ---------------------------------------------------------------------
torchrun_args() {  # node index -> torchrun flags; static rendezvous: node_rank i, the master address and port.
  local i=$1 extra=""
  [ "${DEVICES[$i]}" = "$(seq -s, 0 $((SLOTS[$i] - 1)))" ] || extra="CUDA_VISIBLE_DEVICES=${DEVICES[$i]} "
  echo "${extra}$(printf %q "$VENV_DIR/bin/torchrun") --nnodes=$NNODES --node_rank=$i --nproc_per_node=${SLOTS[$i]}" \
    "--master_addr=$MASTER_ADDR --master_port=$MASTER_PORT --max_restarts=0 --monitor_interval=0.5 --no-python"
}
node_command() {  # node index -> what runs on that node (a shell command line)
  local i=$1
  case "$BACKEND" in
    torchrun-ssh|local)
      echo "cd $(printf %q "$REPO_DIR") && exec env $(env_words)LAUNCH_HOST=${HOSTS[$i]} $(torchrun_args "$i") $(quote_words "${RANK_CMD[@]}")" ;;
    deepspeed)
      # What DeepSpeed's pdsh runner starts on node i (it substitutes %n with the node index).
      echo "export <each line of $LOG_DIR/ds.env>; cd $REPO_DIR; $PY -u -m deepspeed.launcher.launch" \
        "--world_info=$WORLD_INFO --node_rank=$i --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT" \
        "--no_python --no_local_rank ${RANK_CMD[0]} (runs \$LAUNCH_RANK_CMD: $(quote_words "${RANK_CMD[@]:1}"))" ;;
  esac
}
rank_range() { local i=$1 first=0 j; for ((j = 0; j < i; j++)); do first=$((first + SLOTS[j])); done
  echo "$first-$((first + SLOTS[i] - 1))"; }

ds_include() { local i out=""; for i in "${!HOSTS[@]}"; do out+="${HOSTS[$i]}:${DEVICES[$i]}@"; done; echo "${out%@}"; }
prepare_deepspeed() {  # again for each attempt: the env file names the attempt's dirs, a spare changes the hosts
  # DeepSpeed's pdsh runner pastes `cd <cwd>; <python> -u -m ...` and `export NAME=<value>` into one remote shell
  # line unquoted: paths with spaces or shell characters would break it (or run as commands).
  for p in "$REPO_DIR" "$PY"; do
    [[ $p =~ ^[A-Za-z0-9/._+-]+$ ]] || die "--backend deepspeed cannot run from '$p': DeepSpeed's runner puts this path unquoted into a shell command; use a path of letters, digits and /._+- only, or --backend torchrun-ssh" 2
  done
  # Its env file: our settings (the user's variables are not in it). The runner writes `export NAME="VALUE"` when
  # VALUE has a character outside [\w@%+=:,./-], else `export NAME=VALUE`: escaping \ " $ ` gives the literal
  # value in the first case and changes nothing in the second.
  dq_escape() { local v=$1; v=${v//\\/\\\\}; v=${v//\"/\\\"}; v=${v//\$/\\\$}; v=${v//\`/\\\`}; printf '%s' "$v"; }
  while IFS= read -r line; do printf '%s=%s\n' "${line%%=*}" "$(dq_escape "${line#*=}")"; done < <(cat "$LOG_DIR/launch.env"; attempt_env) >"$LOG_DIR/ds.env"
  # shellcheck disable=SC2046  # host names and slot lists are single words
  WORLD_INFO=$("$PY" -c 'import base64, json, sys
hosts = sys.argv[1::2]; devs = sys.argv[2::2]
info = {h: [int(d) for d in ds.split(",")] for h, ds in zip(hosts, devs)}
print(base64.urlsafe_b64encode(json.dumps(info).encode()).decode())' \
    $(for i in "${!HOSTS[@]}"; do echo "${HOSTS[$i]} ${DEVICES[$i]}"; done))
  # The resolved hostfile: only the selected hosts, so DeepSpeed sees exactly the plan printed here.
  for i in "${!HOSTS[@]}"; do echo "${HOSTS[$i]} slots=${SLOTS[$i]}"; done >"$LOG_DIR/hostfile"
  DS_CMD=("$PY" -u -m deepspeed.launcher.runner --hostfile "$LOG_DIR/hostfile" --include "$(ds_include)"
    --launcher pdsh --force_multi --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"
    --no_python --no_local_rank "${RANK_CMD[0]}")
}
[ "$BACKEND" != deepspeed ] || prepare_deepspeed
slurm_script() {
  local nodelist gpus=""
  nodelist=$(IFS=,; echo "${HOSTS[*]}")
  # GPUs only for a cuda recipe: on a cluster without GRES gpu, sbatch refuses --gpus-per-node outright.
  [ "$DEVICE" != cuda ] || gpus="#SBATCH --gpus-per-node=${SLOTS[0]}"$'\n'
  cat <<EOF
#!/bin/bash
#SBATCH --job-name=$RUN_ID
#SBATCH --nodes=$NNODES
#SBATCH --ntasks-per-node=1
#SBATCH --nodelist=$nodelist
#SBATCH --output="$LOG_DIR/slurm-%j.out"
#SBATCH --open-mode=append
${gpus}#SBATCH --requeue
#SBATCH --signal=B:USR1@$SLURM_GRACE
# world size $WORLD_SIZE = $NNODES nodes x ${SLOTS[0]} ranks; $LAYOUT_DESC; device $DEVICE
# Requeue: \`scontrol requeue\` (or a node failure) restarts this script; training resumes from the newest complete
# checkpoint. $SLURM_GRACE s before the time limit Slurm sends USR1 here: the ranks get SIGTERM (they save a
# checkpoint and exit 0) and the job requeues itself.
set -uo pipefail
$(while IFS= read -r l; do printf 'export %s=%q\n' "${l%%=*}" "${l#*=}"; done <"$LOG_DIR/launch.env")
export MASTER_ADDR=\${MASTER_ADDR:-$( [ -n "$MASTER_ADDR_OPT" ] && printf %q "$MASTER_ADDR_OPT" || echo "\$(scontrol show hostnames \"\$SLURM_JOB_NODELIST\" | head -n1)")}
export MASTER_PORT=$MASTER_PORT
export LAUNCH_HOSTS="\$(scontrol show hostnames "\$SLURM_JOB_NODELIST" | tr '\n' ' ')"
# The 0600 env file: every rank reads it at start, a requeued job again; removed when the job ends for good (here,
# or by launch/stop.sh), not when Slurm stops this attempt to requeue it.
drop_env_file() { $([ -z "$SECRET_ENV" ] && echo ":" || echo "rm -f $(printf %q "$SECRET_ENV")"); }
source $(printf %q "$LAUNCH_DIR/lib.sh")  # report_first_failure
cd $(printf %q "$REPO_DIR")
started=\$EPOCHREALTIME  # this attempt's failures only: a requeued job appends to the same logs
echo "[launch] job \$SLURM_JOB_ID (restart \${SLURM_RESTART_COUNT:-0}) on \$LAUNCH_HOSTS at \$(date -u +%FT%TZ)"
# The per-rank command as words, quoted once here; the bash -c text below contains none of them.
rank_cmd=($(quote_words "$VENV_DIR/bin/torchrun" "${RANK_CMD[@]}"))
pre_empted=0
# scancel without --batch/--full signals the steps only (not this script): the ranks get SIGTERM, save, exit 0.
on_usr1() { pre_empted=1; echo "[launch] USR1: time limit near, stopping the ranks (they save) to requeue"; scancel --signal=TERM "\$SLURM_JOB_ID"; }
trap on_usr1 USR1
# One torchrun per node; --kill-on-bad-exit stops every node when one fails. In the background: bash runs a trap
# only between commands, and \`wait\` returns on a signal.
srun --kill-on-bad-exit=1 --wait=60 --open-mode=append --output=$(printf %q "$LOG_DIR")/%N.log \\
  bash -c 'exec "\$0" --nnodes=\$SLURM_NNODES --node_rank=\$SLURM_NODEID --nproc_per_node=${SLOTS[0]} --master_addr=\$MASTER_ADDR --master_port=\$MASTER_PORT --max_restarts=0 --no-python "\$@"' "\${rank_cmd[@]}" &
srun_pid=\$!
wait "\$srun_pid"; rc=\$?
while kill -0 "\$srun_pid" 2>/dev/null; do wait "\$srun_pid"; rc=\$?; done
if [ "\$pre_empted" = 1 ]; then
  echo "[launch] requeueing job \$SLURM_JOB_ID: it resumes from the newest complete checkpoint"
  scontrol requeue "\$SLURM_JOB_ID"
  exit 0
fi
if [ "\$rc" -ne 0 ]; then
  drop_env_file
  report_first_failure $(printf %q "$LOG_DIR") " the job ends (every rank was stopped)." "\$started" 2>&1 || echo "[launch] FAILED: srun exited with code \$rc before any rank reported; see $(printf %q "$LOG_DIR")/"
  exit "\$rc"
fi
drop_env_file
echo "[launch] job \$SLURM_JOB_ID finished: all $WORLD_SIZE ranks exited 0"
EOF
}

# --- dry run: the plan and the resolved command per node -----------------------------------------------------------
print_plan() {
  echo "plan: backend=$BACKEND nodes=$NNODES world_size=$WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT run_id=$RUN_ID"
  echo "layout: $LAYOUT_DESC"
  echo "logs: $LOG_DIR"
  echo "env: $(cut -d= -f1 "$LOG_DIR/launch.env" | tr '\n' ' ')"
  # names only: the values reach the ranks in a 0600 file ($LOG_DIR/secret.env), never a plan, a log or argv
  [ -z "$SECRET_NAMES" ] || echo "user env (values not shown): $(echo $SECRET_NAMES)"
  local i
  for i in "${!HOSTS[@]}"; do
    case "$BACKEND" in
      slurm) echo "node $i ${HOSTS[$i]} slots=${SLOTS[$i]} ranks=$(rank_range "$i")" ;;
      local) echo "node $i ${HOSTS[$i]} slots=${SLOTS[$i]} ranks=$(rank_range "$i"): $(node_command "$i")" ;;
      *) echo "node $i ${HOSTS[$i]} slots=${SLOTS[$i]} ranks=$(rank_range "$i"): $(node_command "$i")" ;;
    esac
  done
  [ "$BACKEND" = deepspeed ] && echo "runner: DS_ENV_FILE=$LOG_DIR/ds.env $(quote_words "${DS_CMD[@]}")"
  return 0
}
print_plan >"$LOG_DIR/plan.txt"
if [ "$BACKEND" = slurm ]; then slurm_script >"$LOG_DIR/job.sbatch"; fi
if [ "$DRY_RUN" = 1 ]; then
  cat "$LOG_DIR/plan.txt"
  if [ "$BACKEND" = slurm ]; then echo "--- $LOG_DIR/job.sbatch"; cat "$LOG_DIR/job.sbatch"; fi
  exit 0
fi

# --- start ---------------------------------------------------------------------------------------------------------
# A reused --log-dir: keep the previous run's logs aside (their LAUNCH-FAIL lines must not stop this run).
if compgen -G "$LOG_DIR/*.log" >/dev/null || [ -e "$LOG_DIR/stop_requested" ]; then
  prev="$LOG_DIR/previous-$(date +%Y%m%d-%H%M%S)-$$"
  mkdir -p "$prev" && mv "$LOG_DIR"/*.log "$LOG_DIR"/stop_requested "$LOG_DIR"/hosts.d "$LOG_DIR"/attempt-* \
    "$LOG_DIR"/restarts.jsonl "$prev"/ 2>/dev/null
  say "moved the previous run's logs in $LOG_DIR to $prev"
fi
printf '%s\n' "${HOSTS[@]}" >"$LOG_DIR/hosts"
echo "$BACKEND" >"$LOG_DIR/backend"
echo "${LAUNCH_SSH_CONFIG:-}" >"$LOG_DIR/ssh_config"
# One run per checkpoint.dir (recipes/run_lease.py): refused here, before anything starts, while another run holds it.
# It also says how long a stop waits for the ranks' pre-emption save (checkpoint.stop_grace_seconds); stop.sh reads
# it from the run directory; LAUNCH_STOP_GRACE, when set, overrides it.
lease_out=$(cd "$REPO_DIR" && LAUNCH_RUN_ID=$RUN_ID "$PY" -m recipes.checkpoint.lease check "$RECIPE" "${OVERRIDES[@]}") ||
  die "nothing was started" 5
STOP_GRACE=$(sed -n 's/^stop_grace_seconds=\([0-9][0-9]*\)$/\1/p' <<<"$lease_out")
STOP_GRACE=${LAUNCH_STOP_GRACE:-${STOP_GRACE:-10}}
echo "$STOP_GRACE" >"$LOG_DIR/stop_grace"
if [ -n "$SECRET_ENV" ]; then
  write_secret_env_file "$SECRET_ENV"
  # Slurm's job removes it when it ends; here it goes when the launcher exits, on this machine and on the nodes.
  [ "$BACKEND" = slurm ] || at_exit "rm -f $(printf %q "$SECRET_ENV")"
fi
if [ "$BACKEND" = slurm ]; then
  command -v sbatch >/dev/null || die "sbatch not found: this is not a Slurm login node. The job script is $LOG_DIR/job.sbatch (--dry-run prints it)"
  out=$(sbatch --parsable "$LOG_DIR/job.sbatch") || die "sbatch refused $LOG_DIR/job.sbatch: $out"
  echo "${out%%;*}" >"$LOG_DIR/slurm_job_id"
  say "submitted Slurm job ${out%%;*}; logs in $LOG_DIR; stop with launch/stop.sh $LOG_DIR"
  exit 0
fi
if [ "$BACKEND" = deepspeed ] && ! command -v pdsh >/dev/null; then
  die "--backend deepspeed runs DeepSpeed's runner over pdsh, which is not installed: run launch/install_system_deps.sh (apt-get install pdsh), or use --backend torchrun-ssh" 2
fi
if [ "$BACKEND" != local ] && [ "$NO_PREFLIGHT" = 0 ]; then
  check_nodes_reachable "$LOG_DIR" || die "some nodes are not ready (see above); nothing was started" 4
fi
if [ "$BACKEND" != local ] && [ -n "$SECRET_ENV" ]; then
  push_secret_env "$SECRET_ENV" || die "could not copy the env file to every node (see above); nothing was started" 4
  at_exit "drop_secret_env $(printf %q "$SECRET_ENV")"
fi
say "run $RUN_ID: $BACKEND on $NNODES node(s), world size $WORLD_SIZE ($LAYOUT_DESC), master $MASTER_ADDR:$MASTER_PORT"
say "logs: $LOG_DIR/<host>.log"
[ "$MAX_RESTARTS" = 0 ] || say "restarts: up to $MAX_RESTARTS from the newest complete checkpoint (back-off ${BACKOFF_S} s doubling, at most ${BACKOFF_MAX_S} s)${SPARE_HOSTS[*]:+; spares: ${SPARE_HOSTS[*]}}"
[ "$HANG_TIMEOUT_S" = 0 ] || say "hang watchdog: every rank's stack dumped and the job stopped when no rank advances for $HANG_TIMEOUT_S s"

stop_everything() {
  LAUNCH_STOP_BY_LAUNCHER=1 "$LAUNCH_DIR/stop.sh" "$LOG_DIR" >>"$LOG_DIR/launcher.log" 2>&1
}
# Before any node starts: Ctrl-C, kill and a closed terminal (HUP) stop the run on every node.
on_signal() { say "interrupted: stopping run $RUN_ID on all nodes"; stop_everything; exit 130; }
trap on_signal INT TERM HUP
# SIGKILL runs no trap: a watchdog in its own session outlives this launcher and then stops the run on every node
# (stop.sh finds the ranks by run id). A normal exit of the launcher ends the watchdog.
# (A dead launcher its parent has not reaped yet is a zombie: it still answers kill -0.)
setsid bash -c 'while kill -0 "$0" 2>/dev/null && [ "$(cut -d" " -f3 /proc/"$0"/stat 2>/dev/null)" != Z ]; do sleep 1; done
  echo "[launch] the launcher (pid $0) died: stopping run on all nodes"; rm -f "$3"
  LAUNCH_STOP_BY_LAUNCHER=1 bash "$2" "$1"' "$$" "$LOG_DIR" "$LAUNCH_DIR/stop.sh" "${SECRET_ENV:-/nonexistent}" \
  </dev/null >>"$LOG_DIR/launcher.log" 2>&1 &
at_exit "kill $! 2>/dev/null"

out_to() {  # tee a stream into a log file (and the terminal unless --quiet)
  if [ "$QUIET" = 1 ]; then cat >>"$1"; else tee -a "$1"; fi
}
start_nodes() {  # one attempt: fills NODE_PIDS / NODE_NAMES
  NODE_PIDS=() NODE_NAMES=()
  local i h
  case "$BACKEND" in
    local)
      (eval "$(node_command 0)") > >(out_to "$LOG_DIR/${HOSTS[0]}.log") 2>&1 &
      NODE_PIDS+=($!) NODE_NAMES+=("${HOSTS[0]}") ;;
    torchrun-ssh)
      for i in "${!HOSTS[@]}"; do
        run_ssh "${HOSTS[$i]}" "$(node_command "$i")" > >(out_to "$LOG_DIR/${HOSTS[$i]}.log") 2>&1 &
        NODE_PIDS+=($!) NODE_NAMES+=("${HOSTS[$i]}")
      done ;;
    deepspeed)
      # pdsh prefixes every line with "host: "; split them into per-node logs, the rest goes to launcher.log.
      # The host list is loaded into awk once: a line's text (rank output) is only compared, never run or used as a path.
      split_pdsh() {
        awk -v dir="$LOG_DIR" -v quiet="$QUIET" -v hostlist="${HOSTS[*]}" '
          BEGIN { n = split(hostlist, hs, " "); for (k = 1; k <= n; k++) known[hs[k]] = 1 }
          { i = index($0, ": "); h = (i > 0) ? substr($0, 1, i - 1) : "";
            f = (h in known) ? dir "/" h ".log" : dir "/launcher.log";
            line = (h in known) ? substr($0, i + 2) : $0;
            print line >> f; fflush(f); if (quiet != 1) { print $0; fflush() } }'
      }
      for h in "${HOSTS[@]}"; do : >>"$LOG_DIR/$h.log"; done
      # The runner gets none of the user's variables: it would paste MLFLOW_* (and any it is given) as `export X=...`
      # into the pdsh command line and its log. The ranks read them from the 0600 env file instead.
      local unset_words=() name
      for name in $SECRET_NAMES; do unset_words+=(-u "$name"); done
      # In its own session: on SIGINT/SIGTERM (a Ctrl-C reaches the whole terminal's process group) DeepSpeed's runner
      # runs `pkill -f "<python> -u -m deepspeed.launcher.launch"` on every node, which kills every DeepSpeed run from
      # this venv there, other people's included. This run is stopped by run id (stop.sh) instead.
      (cd "$REPO_DIR" && DS_ENV_FILE="$LOG_DIR/ds.env" exec setsid env "${unset_words[@]}" "${DS_CMD[@]}") \
        > >(split_pdsh) 2>&1 &
      NODE_PIDS+=($!) NODE_NAMES+=("deepspeed-runner") ;;
  esac
}

# --- supervise: the first non-zero exit, LAUNCH-FAIL line or hang verdict ends the attempt ------------------------
supervise() {
  failed="" first_bad_node=""
  local i pid rc alive
  while :; do
    alive=0
    for i in "${!NODE_PIDS[@]}"; do
      pid=${NODE_PIDS[$i]}
      [ -n "$pid" ] || continue
      if kill -0 "$pid" 2>/dev/null; then alive=1; continue; fi
      wait "$pid"; rc=$?
      NODE_PIDS[$i]=""
      if [ "$rc" -ne 0 ] && [ -z "$failed" ]; then failed="exit $rc"; first_bad_node=${NODE_NAMES[$i]}; fi
    done
    if [ -z "$failed" ] && grep -qs 'LAUNCH-FAIL rank=' "$LOG_DIR"/*.log; then failed="rank failure"; fi
    if [ -z "$failed" ] && [ -s "$ATTEMPT_DIR/hang.json" ]; then failed=hang; fi
    [ -n "$failed" ] || [ "$alive" = 1 ] || break
    [ -z "$failed" ] || break
    sleep 0.5
  done
}

# SIGUSR2 to every rank that wrote a heartbeat (faulthandler writes its stack to ATTEMPT_DIR/stacks/rank-R.txt),
# on its own node; only processes of this run are signalled (stop.sh --signal-local checks the run id).
dump_stacks() {
  local host pids jobs=()
  while read -r host pids; do
    [ -n "$host" ] || continue
    if [ "$BACKEND" = local ]; then
      # shellcheck disable=SC2086  # pids: numbers
      bash "$LAUNCH_DIR/stop.sh" --signal-local USR2 "$RUN_ID" $pids >>"$LOG_DIR/launcher.log" 2>&1
    else
      run_ssh "$host" "bash $(printf %q "$LAUNCH_DIR/stop.sh") --signal-local USR2 $(printf %q "$RUN_ID") $pids" \
        >>"$LOG_DIR/launcher.log" 2>&1 &
      jobs+=($!)
    fi
  done < <("$PY" "$LAUNCH_DIR/watchdog.py" pids "$ATTEMPT_DIR/heartbeat")
  [ ${#jobs[@]} -eq 0 ] || wait "${jobs[@]}"
  sleep 1  # faulthandler writes at once; give a shared file system a moment before the ranks are stopped
}

stop_nodes() {  # every rank on every node, then the local ends of the node commands
  local t0=$SECONDS i pid deadline
  stop_everything
  deadline=$((SECONDS + STOP_GRACE + 20))
  for i in "${!NODE_PIDS[@]}"; do
    pid=${NODE_PIDS[$i]}
    [ -n "$pid" ] || continue
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  sleep 0.3  # let the log tees drain
  STOP_SECONDS=$((SECONDS - t0))
}

# A host that failed twice makes way for a spare with the same slots (the world and the layout stay as they are).
# Returns 1, with REASON set, when none is left.
replace_host() {
  local bad=$1 i j
  for i in "${!HOSTS[@]}"; do [ "${HOSTS[$i]}" = "$bad" ] && break; done
  [ "${HOSTS[$i]}" = "$bad" ] || return 0
  for j in "${!SPARE_HOSTS[@]}"; do
    [ "${SPARE_SLOTS[$j]}" = "${SLOTS[$i]}" ] || continue
    local spare=${SPARE_HOSTS[$j]}
    if [ "$NO_PREFLIGHT" = 0 ]; then
      local saved=("${HOSTS[@]}")
      HOSTS=("$spare")
      if ! check_nodes_reachable "$LOG_DIR"; then HOSTS=("${saved[@]}"); unset 'SPARE_HOSTS[j]' 'SPARE_SLOTS[j]' 'SPARE_DEVICES[j]'; continue; fi
      HOSTS=("${saved[@]}")
    fi
    say "host $bad failed twice: replaced by spare $spare (slots=${SPARE_SLOTS[$j]}); the world stays $WORLD_SIZE ranks"
    REPLACED="$bad>$spare"
    HOSTS[i]=$spare DEVICES[i]=${SPARE_DEVICES[$j]}
    unset 'SPARE_HOSTS[j]' 'SPARE_SLOTS[j]' 'SPARE_DEVICES[j]'
    SPARE_HOSTS=("${SPARE_HOSTS[@]}") SPARE_SLOTS=("${SPARE_SLOTS[@]}") SPARE_DEVICES=("${SPARE_DEVICES[@]}")
    printf '%s\n' "${HOSTS[@]}" >"$LOG_DIR/hosts"
    if [ "$i" = 0 ] && [ -z "$MASTER_ADDR_OPT" ]; then MASTER_ADDR=$(resolve_addr "${HOSTS[0]}"); fi
    if [ -n "$SECRET_ENV" ]; then push_secret_env "$SECRET_ENV" || { REASON="could not copy the env file to spare $spare"; return 1; }; fi
    return 0
  done
  REASON="host $bad failed twice and no spare with slots=${SLOTS[$i]} is left (--spares $SPARES_N)"
  return 1
}

# Back-off before restart k: BACKOFF_S * 2^(k-1), capped; a stop requested meanwhile (stop.sh) ends the wait.
backoff_wait() {
  local end_ms
  end_ms=$(awk -v b="$BACKOFF_S" -v cap="$BACKOFF_MAX_S" -v k="$1" -v now="$(date +%s%3N)" \
    'BEGIN { d = b * 2 ^ (k - 1); if (d > cap) d = cap; printf "%d", now + d * 1000 }')
  while [ "$(date +%s%3N)" -lt "$end_ms" ] && [ ! -e "$LOG_DIR/stop_requested" ]; do sleep 0.2; done
}
backoff_seconds() { awk -v b="$BACKOFF_S" -v cap="$BACKOFF_MAX_S" -v k="$1" 'BEGIN { d = b * 2 ^ (k - 1); if (d > cap) d = cap; print d }'; }

declare -A HOST_FAILURES=()
ATTEMPT=1 RESTARTS=0 WATCH_PID=""
at_exit 'kill $WATCH_PID 2>/dev/null'
while :; do
  ATTEMPT_DIR=$LOG_DIR/attempt-$ATTEMPT
  mkdir -p "$ATTEMPT_DIR/heartbeat" "$ATTEMPT_DIR/stacks"
  [ "$BACKEND" != deepspeed ] || prepare_deepspeed
  [ "$ATTEMPT" = 1 ] || [ -n "$MASTER_PORT_OPT" ] || pick_master_port  # a port the old rendezvous may still hold
  if [ "$HANG_TIMEOUT_S" != 0 ]; then
    "$PY" "$LAUNCH_DIR/watchdog.py" watch "$ATTEMPT_DIR/heartbeat" --world "$WORLD_SIZE" --timeout "$HANG_TIMEOUT_S" \
      --out "$ATTEMPT_DIR/hang.json" </dev/null >>"$LOG_DIR/launcher.log" 2>&1 &
    WATCH_PID=$!
  fi
  ATTEMPT_HOSTS=("${HOSTS[@]}")
  start_nodes
  supervise
  [ -z "$WATCH_PID" ] || { kill "$WATCH_PID" 2>/dev/null; wait "$WATCH_PID" 2>/dev/null; WATCH_PID=""; }

  if [ -z "$failed" ]; then
    after=""
    [ "$RESTARTS" = 0 ] || after=" (after $RESTARTS restart(s))"
    say "run $RUN_ID finished: all $WORLD_SIZE ranks exited 0$after"
    exit 0
  fi
  requested=0
  [ -f "$LOG_DIR/stop_requested" ] && requested=1  # stop.sh writes it before it stops anything
  bad_host="" why="" exit_code="" bad_rank=""
  if [ "$failed" = hang ]; then
    say "no rank advanced for $HANG_TIMEOUT_S s: dumping every rank's stack into $ATTEMPT_DIR/stacks/"
    "$PY" "$LAUNCH_DIR/watchdog.py" field "$ATTEMPT_DIR/hang.json" report | while IFS= read -r l; do say "$l"; done
    dump_stacks
    bad_rank=$("$PY" "$LAUNCH_DIR/watchdog.py" field "$ATTEMPT_DIR/hang.json" behind)
    bad_host=$("$PY" "$LAUNCH_DIR/watchdog.py" field "$ATTEMPT_DIR/hang.json" culprit_host)
    why="hang (no rank advanced for $HANG_TIMEOUT_S s)"
  fi
  if [ "$requested" = 1 ]; then
    say "stopping run $RUN_ID on all ${NNODES} node(s) (launch/stop.sh was called)"
  else
    say "${why:-a rank failed}: stopping run $RUN_ID on all ${NNODES} node(s)"
  fi
  stop_nodes
  if [ "$requested" = 1 ]; then
    say "STOPPED: run $RUN_ID was stopped on request (launch/stop.sh); every rank on every node is gone."
    exit 1
  fi
  if [ "$failed" != hang ]; then
    FAIL_RANK="" FAIL_HOST="" FAIL_EXIT=""
    if report_first_failure "$LOG_DIR" " all ranks were stopped ($STOP_SECONDS s)."; then
      bad_rank=$FAIL_RANK bad_host=$FAIL_HOST exit_code=$FAIL_EXIT why="exit code $FAIL_EXIT"
    else
      say "FAILED: node $first_bad_node ($failed) before any rank reported; all ranks were stopped. See $LOG_DIR/."
      tail -n 15 "$LOG_DIR/$first_bad_node.log" 2>/dev/null | sed 's/^/    /' >&2
      why="node command $failed" exit_code=${failed#exit }
      [ "$first_bad_node" = deepspeed-runner ] || bad_host=$first_bad_node
    fi
  fi
  if [ "$RESTARTS" -ge "$MAX_RESTARTS" ]; then
    [ "$MAX_RESTARTS" = 0 ] || say "FAILED: no restarts left: $RESTARTS of $MAX_RESTARTS used (--max-restarts / supervision.max_restarts); last failure: $why. The run stops."
    exit 1
  fi
  REPLACED=""
  if [ -n "$bad_host" ] && [ "$SPARES_N" -gt 0 ]; then
    HOST_FAILURES[$bad_host]=$((${HOST_FAILURES[$bad_host]:-0} + 1))
    if [ "${HOST_FAILURES[$bad_host]}" -ge 2 ] && ! replace_host "$bad_host"; then
      say "FAILED: $REASON; the run stops after $RESTARTS restart(s)."
      exit 1
    fi
  fi
  RESTARTS=$((RESTARTS + 1))
  # Earlier attempts' logs go to their attempt dir: their LAUNCH-FAIL lines must not end the next attempt.
  for h in "${ATTEMPT_HOSTS[@]}"; do [ ! -e "$LOG_DIR/$h.log" ] || mv "$LOG_DIR/$h.log" "$ATTEMPT_DIR/"; done
  last_step=$("$PY" "$LAUNCH_DIR/watchdog.py" last-step "$ATTEMPT_DIR/heartbeat")
  wait_s=$(backoff_seconds "$RESTARTS")
  say "restart $RESTARTS of $MAX_RESTARTS in $wait_s s (attempt $((ATTEMPT + 1))): $why${bad_rank:+ (rank $bad_rank}${bad_host:+ on host $bad_host}${bad_rank:+)}"
  failed_at=$(date +%s.%N)
  backoff_wait "$RESTARTS"
  if [ -f "$LOG_DIR/stop_requested" ]; then
    say "STOPPED: run $RUN_ID was stopped on request (launch/stop.sh) before restart $RESTARTS."
    exit 1
  fi
  # Resumed from: what the ranks will load (the newest complete checkpoint), read after the back-off.
  resumed=$(cd "$REPO_DIR" && "$PY" "$LAUNCH_DIR/watchdog.py" resume-step "$CKPT_DIR")
  lost=""
  [ -z "$last_step" ] || lost=$((last_step > resumed ? last_step - resumed : 0))
  "$PY" "$LAUNCH_DIR/watchdog.py" record "$LOG_DIR/restarts.jsonl" "time=$(date -u +%FT%TZ)" "restart=$RESTARTS" \
    "attempt=$((ATTEMPT + 1))" "why=$why" "exit_code=$exit_code" "rank=$bad_rank" "host=$bad_host" \
    "resumed_from_step=$resumed" "last_step=$last_step" "steps_lost=$lost" "backoff_s=$wait_s" \
    "failed_at=$failed_at" "replaced=$REPLACED" "hosts=${HOSTS[*]}"
  from="step $resumed (the newest complete checkpoint)"
  [ "$resumed" != 0 ] || from="the start (no complete checkpoint)"
  say "restarting run $RUN_ID from $from${lost:+, $lost step(s) lost,} on ${HOSTS[*]}"
  ATTEMPT=$((ATTEMPT + 1))
done
