#!/usr/bin/env bash
# Check a cluster before committing it to a run, and start nothing (except the optional communication check):
# hostfile syntax and selection, world size vs the recipe's TP x PP x DP, ssh to every node, the repo and venv on
# it, GPUs vs slots (nvidia-smi), a writable checkpoint dir shared by all nodes, the data paths visible everywhere,
# and with --comm-check an all-reduce bandwidth test across all ranks (launch/commcheck.py).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# shellcheck disable=SC2154  # usage_common comes from lib.sh
usage() {
  cat >&2 <<USAGE
usage: launch/preflight.sh RECIPE --hostfile FILE [options] [-- section.key=value ...]
$usage_common
exit codes: 0 ready, 2 bad hostfile/arguments, 3 world size does not fit the recipe, 4 a node is not ready
USAGE
}

parse_args "$@"
setup_ssh
plan_nodes
check_layout
say "hostfile: ${#HOSTS[@]} node(s), world size $WORLD_SIZE -> $LAYOUT_DESC"

facts=$(cd "$REPO_DIR" && "$PY" "$LAUNCH_DIR/layout_check.py" --facts "$RECIPE" "$WORLD_SIZE" "${OVERRIDES[@]}") || exit 3
device=$(sed -n 's/^device=//p' <<<"$facts")
ckpt=$(sed -n 's/^checkpoint_dir=//p' <<<"$facts")
mapfile -t data_paths < <(sed -n 's/^data_path=//p' <<<"$facts")
work=$(mktemp -d "${TMPDIR:-/tmp}/preflight.XXXXXX")
trap 'rm -rf "$work" "${SSH_SHIM_DIR:-}"' EXIT
marker=".preflight-shared-$$-$RANDOM"
if [ -n "$ckpt" ]; then
  mkdir -p "$ckpt" 2>/dev/null && touch "$ckpt/$marker" 2>/dev/null \
    || die "checkpoint.dir $ckpt is not writable from this host; fix the path or its permissions" 4
fi

if [ "$BACKEND" = local ]; then
  remote() { bash -c "$2" </dev/null; }
else
  remote() { run_ssh "$1" "$2"; }
fi
for i in "${!HOSTS[@]}"; do
  cmd="test -x $(printf %q "$PY") && test -d $(printf %q "$REPO_DIR/recipes") && echo repo=ok;"
  cmd+=" bash $(printf %q "$LAUNCH_DIR/node_check.sh") $(quote_words "${SLOTS[$i]}" "$device" "$ckpt" "$marker" "${data_paths[@]}")"
  (remote "${HOSTS[$i]}" "$cmd" >"$work/${HOSTS[$i]}" 2>&1) &
done
wait

bad=0
for i in "${!HOSTS[@]}"; do
  h=${HOSTS[$i]} f="$work/${HOSTS[$i]}" problems=()
  if ! grep -q '^host=' "$f"; then
    problems+=("unreachable over ssh: $(head -c 300 "$f" | tr '\n' ' ') -- fix: passwordless ssh to $h (try: ssh $h true)")
  else
    grep -q '^repo=ok' "$f" \
      || problems+=("no repo/venv at $REPO_DIR -- fix: the same checkout + launch/setup_env.sh on every node (or a shared filesystem)")
    gpus=$(sed -n 's/^gpus=//p' "$f")
    if [ "$gpus" = none ]; then
      [ "$device" = cpu ] \
        || problems+=("no nvidia-smi but the recipe runs on $device -- fix: install the NVIDIA driver, or cluster.device=cpu for a CPU run")
    elif [ "$gpus" -lt "${SLOTS[$i]}" ]; then
      problems+=("$gpus GPU(s) but slots=${SLOTS[$i]} -- fix: '$h slots=$gpus' in the hostfile, or --num-gpus $gpus")
    fi
    if [ -n "$ckpt" ]; then
      grep -q '^ckpt_writable=yes' "$f" || problems+=("checkpoint.dir $ckpt is not writable -- fix: create it or its permissions")
      grep -q '^ckpt_shared=yes' "$f" \
        || problems+=("checkpoint.dir $ckpt is not the directory this host sees -- fix: a filesystem every node mounts")
    fi
    while read -r p; do
      problems+=("data path $p is not visible -- fix: a shared filesystem, or copy the data to every node")
    done < <(sed -n 's/^data_visible=no //p' "$f")
  fi
  if [ ${#problems[@]} -eq 0 ]; then
    say "node $h: ok (slots=${SLOTS[$i]}, gpus=$(sed -n 's/^gpus=//p' "$f"))"
  else
    bad=1
    for p in "${problems[@]}"; do say "node $h: $p"; done
  fi
done
[ -z "$ckpt" ] || rm -f "$ckpt/$marker"
[ "$bad" = 0 ] || die "preflight failed: fix the nodes above before launching" 4
say "preflight ok: ${#HOSTS[@]} node(s), world size $WORLD_SIZE"

if [ "$COMM_CHECK" = 1 ]; then
  say "communication check: all-reduce across all $WORLD_SIZE ranks"
  args=("$RECIPE" --backend "$BACKEND" --num-nodes "$NUM_NODES" --num-gpus "$NUM_GPUS"
    --entry "python $LAUNCH_DIR/commcheck.py" --no-preflight)
  [ -z "$MASTER_PORT" ] || args+=(--master-port "$MASTER_PORT")
  [ -z "$HOSTFILE" ] || args+=(--hostfile "$HOSTFILE")
  [ -z "$INCLUDE" ] || args+=(--include "$INCLUDE")
  [ -z "$EXCLUDE" ] || args+=(--exclude "$EXCLUDE")
  [ -z "$MASTER_ADDR_OPT" ] || args+=(--master-addr "$MASTER_ADDR_OPT")
  [ -z "$LOG_DIR" ] || args+=(--log-dir "$LOG_DIR")
  [ -z "${EXTRA_ENV// /}" ] || args+=(--env "$(echo $EXTRA_ENV | tr ' ' ,)")
  "$LAUNCH_DIR/train.sh" "${args[@]}" -- "${OVERRIDES[@]}"
  exit $?
fi
