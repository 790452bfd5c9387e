# Shared by train.sh, preflight.sh and stop.sh (sourced, not run): argument parsing, the node plan from the
# hostfile, ssh with the user's config, and the checks that run before any training process starts.
# shellcheck shell=bash
# shellcheck disable=SC2034  # the globals set here are read by the scripts that source this file

LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$LAUNCH_DIR/.." && pwd)
VENV_DIR=${LAUNCH_VENV:-$REPO_DIR/.venv}
PY=$VENV_DIR/bin/python

say() { echo "[launch] $*" >&2; }
die() { echo "[launch] error: $1" >&2; exit "${2:-1}"; }

# Clean-up commands run once when the script exits, whatever the reason (one EXIT trap for every script here).
AT_EXIT=()
at_exit() { AT_EXIT+=("$1"); trap run_at_exit EXIT; }
run_at_exit() { local c; for c in "${AT_EXIT[@]}"; do eval "$c"; done; AT_EXIT=(); }

# ssh honours LAUNCH_SSH_CONFIG (an ssh_config file: aliases, ports, keys) everywhere, including inside pdsh and the
# DeepSpeed runner, by putting a one-line ssh wrapper first on PATH. BatchMode: never hang on a password prompt.
setup_ssh() {
  SSH_OPTS=(-o BatchMode=yes -o ConnectTimeout="${LAUNCH_SSH_TIMEOUT:-10}")
  if [ -n "${LAUNCH_SSH_CONFIG:-}" ]; then
    [ -r "$LAUNCH_SSH_CONFIG" ] || die "LAUNCH_SSH_CONFIG=$LAUNCH_SSH_CONFIG is not a readable file"
    SSH_OPTS=(-F "$LAUNCH_SSH_CONFIG" "${SSH_OPTS[@]}")
    # A parent launch script (preflight --comm-check -> train.sh) already put its wrapper on PATH.
    [ -x "${LAUNCH_SSH_SHIM:-}/ssh" ] && return 0
    local shim_dir
    shim_dir=$(mktemp -d "${TMPDIR:-/tmp}/launch-ssh.XXXXXX")
    SSH_SHIM_DIR=$shim_dir
    at_exit "rm -rf $(printf %q "$shim_dir")"
    local real_ssh
    real_ssh=$(PATH=${PATH#"$shim_dir:"} command -v ssh) || die "ssh is not installed (apt-get install openssh-client)"
    printf '#!/bin/sh\nexec %q -F %q "$@"\n' "$real_ssh" "$LAUNCH_SSH_CONFIG" >"$shim_dir/ssh"
    chmod +x "$shim_dir/ssh"
    export PATH="$shim_dir:$PATH" LAUNCH_SSH_SHIM=$shim_dir
    export PDSH_SSH_ARGS_APPEND="${PDSH_SSH_ARGS_APPEND:-} -F $LAUNCH_SSH_CONFIG"
  fi
}
run_ssh() { ssh "${SSH_OPTS[@]}" "$@" </dev/null; }

# The address other nodes reach the first host at: ssh's resolved HostName (so ssh aliases work), else the name.
resolve_addr() {
  local addr
  addr=$(ssh "${SSH_OPTS[@]}" -G "$1" 2>/dev/null | awk '$1=="hostname"{print $2; exit}')
  echo "${addr:-$1}"
}

usage_common='
  --hostfile FILE          DeepSpeed-style hostfile: "host slots=N" per line, # comments (default: $LAUNCH_HOSTFILE)
  --backend NAME           deepspeed (default when pdsh exists) | torchrun-ssh | slurm | local
  --include SPEC           hosts/slots to use, DeepSpeed syntax: host1@host2 or host1:0,1@host2
  --exclude SPEC           hosts/slots to leave out (same syntax)
  --num-nodes N            use the first N selected hosts
  --num-gpus N             use N slots per host
  --master-addr ADDR       rendezvous address (default: the first host, as ssh resolves it)
  --master-port PORT       rendezvous port (default: derived from the run id, the first free one on the master)
  --env VAR[,VAR...]       also propagate these variables to every rank (or set LAUNCH_EXPORT="VAR VAR")
  --entry CMD              the per-rank program (default: "python -m recipes train"; python = the venv python)
  --log-dir DIR            where per-node logs go (default runs/launch/RUN_ID)
  --run-id ID              name of this run (default: recipe name + time)
  --comm-check             (preflight) also run the all-reduce bandwidth check across all ranks
  --dry-run                print the plan and the resolved command per node; start nothing
  -- OVERRIDES...          section.key=value recipe overrides, passed to every rank'

parse_args() {
  RECIPE="" HOSTFILE=${LAUNCH_HOSTFILE:-} BACKEND="" INCLUDE="" EXCLUDE="" NUM_NODES=0 NUM_GPUS=0
  MASTER_ADDR_OPT="" MASTER_PORT=${MASTER_PORT:-} EXTRA_ENV=${LAUNCH_EXPORT:-} ENTRY="python -m recipes train"
  LOG_DIR="" RUN_ID="" DRY_RUN=0 COMM_CHECK=0 NO_PREFLIGHT=0 OVERRIDES=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --hostfile) HOSTFILE=$2; shift 2 ;;
      --backend) BACKEND=$2; shift 2 ;;
      --include) INCLUDE=$2; shift 2 ;;
      --exclude) EXCLUDE=$2; shift 2 ;;
      --num-nodes) NUM_NODES=$2; shift 2 ;;
      --num-gpus) NUM_GPUS=$2; shift 2 ;;
      --master-addr) MASTER_ADDR_OPT=$2; shift 2 ;;
      --master-port) MASTER_PORT=$2; shift 2 ;;
      --env) EXTRA_ENV="$EXTRA_ENV ${2//,/ }"; shift 2 ;;
      --entry) ENTRY=$2; shift 2 ;;
      --log-dir) LOG_DIR=$2; shift 2 ;;
      --run-id) RUN_ID=$2; shift 2 ;;
      --comm-check) COMM_CHECK=1; shift ;;
      --no-preflight) NO_PREFLIGHT=1; shift ;;
      --dry-run) DRY_RUN=1; shift ;;
      -h|--help) usage; exit 0 ;;
      --) shift; OVERRIDES=("$@"); break ;;
      -*) die "unknown option '$1' (see --help)" 2 ;;
      *) [ -z "$RECIPE" ] || die "two recipes given: '$RECIPE' and '$1' (overrides go after --)" 2; RECIPE=$1; shift ;;
    esac
  done
  [ -n "$RECIPE" ] || { usage; die "no recipe given" 2; }
  if [ -z "$BACKEND" ]; then
    if [ -z "$HOSTFILE" ]; then BACKEND=local
    elif command -v pdsh >/dev/null; then BACKEND=deepspeed
    else BACKEND=torchrun-ssh; fi
  fi
  case "$BACKEND" in deepspeed|torchrun-ssh|slurm|local) ;; *)
    die "--backend '$BACKEND' unknown; use deepspeed, torchrun-ssh, slurm or local" 2 ;;
  esac
  [ "$BACKEND" = local ] || [ -n "$HOSTFILE" ] || die "--backend $BACKEND needs --hostfile FILE (or LAUNCH_HOSTFILE)" 2
  [ -z "$MASTER_PORT" ] || [ "$MASTER_PORT" -gt 0 ] 2>/dev/null || die "--master-port '$MASTER_PORT' is not a port number" 2
  [ -x "$PY" ] || die "no Python at $PY; run launch/setup_env.sh (or set LAUNCH_VENV)"
}

# Fills HOSTS, SLOTS, DEVICES (arrays, node order), WORLD_SIZE from the hostfile and the selection flags.
# Every hostfile problem is reported at once, before anything starts.
plan_nodes() {
  HOSTS=() SLOTS=() DEVICES=()
  local plan host slots devs
  if [ -z "$HOSTFILE" ]; then
    local n=$NUM_GPUS
    if [ "$n" -eq 0 ]; then
      n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
      [ "$n" -gt 0 ] || n=1
    fi
    HOSTS=(localhost) SLOTS=("$n") DEVICES=("$(seq -s, 0 $((n - 1)))")
  else
    plan=$("$PY" "$LAUNCH_DIR/hostfile.py" plan "$HOSTFILE" --include "$INCLUDE" --exclude "$EXCLUDE" \
      --num-nodes "$NUM_NODES" --num-gpus "$NUM_GPUS") || exit 2
    while read -r host slots devs; do
      HOSTS+=("$host") SLOTS+=("$slots") DEVICES+=("$devs")
    done <<<"$plan"
  fi
  WORLD_SIZE=0
  local s
  for s in "${SLOTS[@]}"; do WORLD_SIZE=$((WORLD_SIZE + s)); done
  if [ "$BACKEND" = local ] && [ "${#HOSTS[@]}" -gt 1 ]; then
    die "--backend local runs on one node but the selection has ${#HOSTS[@]} hosts (${HOSTS[*]}); add --num-nodes 1 or use another backend" 2
  fi
  # torchrun and srun give every node the same number of ranks; DeepSpeed's runner copes with uneven nodes.
  if [ "$BACKEND" != deepspeed ]; then
    for s in "${SLOTS[@]}"; do
      [ "$s" = "${SLOTS[0]}" ] || die "backend $BACKEND needs the same slots on every host (got ${SLOTS[*]}); use --num-gpus N or --backend deepspeed" 2
    done
  fi
  if [ -n "$MASTER_ADDR_OPT" ]; then MASTER_ADDR=$MASTER_ADDR_OPT
  elif [ "$BACKEND" = local ]; then MASTER_ADDR=127.0.0.1
  else MASTER_ADDR=$(resolve_addr "${HOSTS[0]}"); fi
}

# World size vs the recipe's TP x PP x DP; refuses with the fix. Sets LAYOUT_DESC.
check_layout() {
  LAYOUT_DESC=$(cd "$REPO_DIR" && "$PY" "$LAUNCH_DIR/layout_check.py" "$RECIPE" "$WORLD_SIZE" "${OVERRIDES[@]}") || exit 3
}

# Reachability and the repo/venv on every node, in parallel; one line per node. Returns non-zero if any node fails.
check_nodes_reachable() {
  local dir=$1 i pids=() bad=0
  for i in "${!HOSTS[@]}"; do
    (run_ssh "${HOSTS[$i]}" "test -x $(printf %q "$PY") && test -d $(printf %q "$REPO_DIR/recipes") && echo ok" \
      >"$dir/reach.${HOSTS[$i]}" 2>&1) &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    if ! grep -qx ok "$dir/reach.${HOSTS[$i]}"; then
      say "node ${HOSTS[$i]}: NOT ready: $(tr '\n' ' ' <"$dir/reach.${HOSTS[$i]}" | cut -c1-300)"
      say "  fix: passwordless ssh to ${HOSTS[$i]} (ssh ${HOSTS[$i]} true), and this repo + venv at $REPO_DIR on it"
      bad=1
    fi
  done
  return $bad
}

# Variables whose values are the user's: --env / LAUNCH_EXPORT, and HF_* / WANDB_* / MLFLOW_* (tokens live there).
# They reach the ranks only through a 0600 file that rank_exec.sh reads (write_secret_env_file), never through a
# command line (visible in ps to every user of a node), plan.txt, job.sbatch or a log; only their names are printed.
secret_env_names() {
  local names=("${EXTRA_NAMES[@]}") name
  for name in $(compgen -e | grep -E '^(HF_|WANDB_|MLFLOW_)' || true); do names+=("$name"); done
  printf '%s\n' "${names[@]}" | awk 'NF && !seen[$0]++'
}

# Refuses names that are not variable names (`${!name}` would evaluate `x[$(cmd)]`), unset variables, and values
# spanning lines (each variable is one NAME=VALUE line of the env files).
check_env() {
  local name
  set -f; read -r -a EXTRA_NAMES <<<"$EXTRA_ENV"; set +f
  for name in "${EXTRA_NAMES[@]}"; do
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "--env '$name' is not a variable name (letters, digits and _, not starting with a digit)" 2
    [ -n "${!name+x}" ] || die "--env $name: the variable is not set here, so it cannot be propagated" 2
  done
  for name in $(plumbing_env_names) $(secret_env_names); do
    case ${!name} in *$'\n'*|*$'\r'*)
      die "$name: the value spans several lines; variables are passed one NAME=VALUE line each: unset it or put the text in a file and pass its path" 2 ;;
    esac
  done
}

plumbing_env_names() {
  compgen -e | grep -E '^(NCCL_|GLOO_|TORCH_NCCL_|TORCH_DISTRIBUTED_|CUDA_DEVICE_ORDER$|OMP_NUM_THREADS$)' || true
}

# The settings every rank gets, as NAME=VALUE lines: the venv (the repo is pip-installed in it), NCCL_*/GLOO_*, threads, and where the
# secret env file is. Nothing in it is secret: it is printed in plans and passed on command lines.
write_env_file() {
  local name secret_file=${1:-}
  {
    echo "PATH=$VENV_DIR/bin:/usr/local/bin:/usr/bin:/bin"
    echo "VIRTUAL_ENV=$VENV_DIR"
    echo "PYTHONUNBUFFERED=1"
    echo "LAUNCH_RUN_ID=$RUN_ID"
    for name in $(plumbing_env_names); do
      echo "$name=${!name}"
    done
    [ -z "$secret_file" ] || echo "LAUNCH_ENV_FILE=$secret_file"
  } | awk -F= '!seen[$1]++'
}

# NAME=VALUE lines of secret_env_names, in a file created 0600 (umask before it exists: never readable by others).
write_secret_env_file() {
  local file=$1 name
  (
    umask 077
    for name in $(secret_env_names); do printf '%s=%s\n' "$name" "${!name}"; done >"$file.tmp"
    mv -f "$file.tmp" "$file"
  )
}

# The env file to every node, at the same path, over ssh's stdin (never its command line); on a shared file system
# each node replaces it with the same bytes. Returns non-zero if a node failed.
push_secret_env() {
  local file=$1 i pids=() bad=0 dir
  dir=$(dirname "$file")
  for i in "${!HOSTS[@]}"; do
    ssh "${SSH_OPTS[@]}" "${HOSTS[$i]}" "umask 077 && mkdir -p $(printf %q "$dir") && cat >$(printf %q "$file.$i.tmp") && mv -f $(printf %q "$file.$i.tmp") $(printf %q "$file")" \
      <"$file" >"$dir/push.${HOSTS[$i]}" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { say "node ${HOSTS[$i]}: cannot write $file: $(tr '\n' ' ' <"$dir/push.${HOSTS[$i]}" | cut -c1-300)"; bad=1; }
    rm -f "$dir/push.${HOSTS[$i]}"
  done
  return $bad
}
drop_secret_env() {  # best effort, at exit: the ranks read it when they started
  local h pids=()
  for h in "${HOSTS[@]}"; do run_ssh "$h" "rm -f $(printf %q "$1")" >/dev/null 2>&1 & pids+=($!); done
  wait "${pids[@]}"
  rm -f "$1"
}

# The rendezvous port when none is given: derived from the run id (two runs sharing a first host get different
# ports: with one fixed default, the second run fails or joins the first one's unauthenticated TCPStore), then the
# first of 16 ports from there that is free on the master host (probed over ssh; not in a dry run or for Slurm,
# where the master is only known when the job starts).
pick_master_port() {
  local base probe
  base=$((20000 + $(printf '%s' "$RUN_ID" | cksum | cut -d' ' -f1) % 20000))
  if [ "$DRY_RUN" = 1 ] || [ "$BACKEND" = slurm ]; then MASTER_PORT=$base; return; fi
  probe='import socket, sys
for p in range(int(sys.argv[1]), int(sys.argv[1]) + 16):
    with socket.socket() as s:
        try:
            s.bind(("", p)); print(p); break
        except OSError:
            pass'
  if [ "$BACKEND" = local ]; then
    MASTER_PORT=$("$PY" -c "$probe" "$base")
  else
    MASTER_PORT=$(run_ssh "${HOSTS[0]}" "$(printf %q "$PY") -c $(printf %q "$probe") $base" 2>/dev/null)
  fi
  [[ $MASTER_PORT =~ ^[0-9]+$ ]] || { say "could not probe a free port on ${HOSTS[0]}; using $base"; MASTER_PORT=$base; }
}

# A command line with every word quoted for a remote shell.
quote_words() { local w out=""; for w in "$@"; do out+="$(printf '%q' "$w") "; done; echo "${out% }"; }

# The per-rank command: the entry (python = the venv python), the recipe and the overrides.
rank_command() {
  local entry
  read -r -a entry <<<"$ENTRY"
  [ "${entry[0]}" = python ] && entry[0]=$PY
  local recipe_abs=$RECIPE
  [ -e "$RECIPE" ] && recipe_abs=$(cd "$(dirname "$RECIPE")" && pwd)/$(basename "$RECIPE")
  RANK_CMD=("$LAUNCH_DIR/rank_exec.sh" "${entry[@]}" --config "$recipe_abs" "${OVERRIDES[@]}")
}

# Names the first rank that died on its own (the earliest LAUNCH-FAIL line of rank_exec.sh in LOG_DIR/*.log, at or
# after SINCE, an epoch time: a requeued Slurm job appends to the same logs) and shows its last output. Returns 1
# when no rank reported.
#   report_first_failure LOG_DIR "text after 'first;'" [SINCE]
report_first_failure() {
  local dir=$1 tail_text=${2:-} since=${3:-0} first frank fhost fexit why=""
  first=$(grep -hos 'LAUNCH-FAIL rank=[0-9]* host=[^ ]* exit=[0-9]* at=[0-9.]*' "$dir"/*.log \
    | sed 's/.*rank=\([0-9]*\) host=\([^ ]*\) exit=\([0-9]*\) at=\([0-9.]*\)/\4 \1 \2 \3/' \
    | awk -v since="$since" '$1 >= since' | sort -n | head -n1)
  [ -n "$first" ] || return 1
  read -r _ frank fhost fexit <<<"$first"
  FAIL_RANK=$frank FAIL_HOST=$fhost FAIL_EXIT=$fexit  # for train.sh's restart record and spare rule
  [ "$fexit" -gt 128 ] && why=" (killed by signal $((fexit - 128)))"
  say "FAILED: rank $frank on host $fhost exited with code $fexit$why first;$tail_text"
  say "last output of rank $frank ($dir/$fhost.log):"
  grep -hF "[$fhost rank $frank]" "$dir/$fhost.log" 2>/dev/null | tail -n 15 | sed 's/^/    /' >&2
  return 0
}

# --spares K (train.sh): the last K hosts of the selection wait outside the world (HOSTS, SLOTS, DEVICES, WORLD_SIZE
# shrink; SPARE_HOSTS, SPARE_SLOTS, SPARE_DEVICES hold them) until a host that failed twice needs replacing.
split_spares() {
  SPARE_HOSTS=() SPARE_SLOTS=() SPARE_DEVICES=()
  [ "${SPARES_N:-0}" -gt 0 ] || return 0
  [ "$BACKEND" != local ] || die "--spares needs hosts to swap in: use a hostfile with --backend torchrun-ssh or deepspeed" 2
  local n=${#HOSTS[@]} keep
  [ "$SPARES_N" -lt "$n" ] || die "--spares $SPARES_N leaves no host to train on: the selection has $n host(s) (${HOSTS[*]})" 2
  keep=$((n - SPARES_N))
  SPARE_HOSTS=("${HOSTS[@]:keep}") SPARE_SLOTS=("${SLOTS[@]:keep}") SPARE_DEVICES=("${DEVICES[@]:keep}")
  HOSTS=("${HOSTS[@]:0:keep}") SLOTS=("${SLOTS[@]:0:keep}") DEVICES=("${DEVICES[@]:0:keep}")
  WORLD_SIZE=0
  local s
  for s in "${SLOTS[@]}"; do WORLD_SIZE=$((WORLD_SIZE + s)); done
}
