#!/usr/bin/env bash
# Runs ONE rank's command (started by torchrun, DeepSpeed's launch or srun): prefixes its output with host and rank,
# and when the command ends writes the rank's exit record into LAUNCH_EXIT_DIR (launch/failures.py): how the launcher
# learns which rank died first. Nothing the rank prints is read as a record.
#   rank_exec.sh CMD [ARGS...]
# Reads RANK (torchrun/DeepSpeed), the node index (GROUP_RANK | CROSS_RANK | SLURM_NODEID) and LAUNCH_HOSTS (the
# hostfile names, in node order) so that the host is named as the user wrote it in the hostfile.
set -u
rank=${RANK:-${SLURM_PROCID:-0}}
node=${GROUP_RANK:-${CROSS_RANK:-${SLURM_NODEID:-0}}}
read -r -a hosts <<<"${LAUNCH_HOSTS:-}"
host=${LAUNCH_HOST:-${hosts[$node]:-$(hostname)}}
export LAUNCH_HOST=$host PYTHONUNBUFFERED=1
tag="[$host rank $rank]"
exits=${LAUNCH_EXIT_DIR:-}
unset LAUNCH_EXIT_DIR  # the rank's program has no business there

# One line `rank=R exit=CODE stopped=0|1 at=EPOCH host=H`, created 0600 under a fresh name and renamed: never written
# through a file or link planted at the final name.
record() {
  [ -n "$exits" ] || return 0
  local tmp
  tmp=$(mktemp "$exits/.rank-$rank.XXXXXX") || return 0
  printf 'rank=%s exit=%s stopped=%s at=%s host=%s\n' "$rank" "$1" "$2" "$3" "$host" >"$tmp" &&
    mv -f "$tmp" "$exits/rank-$rank.exit"
}

# The user's variables (--env, HF_*, WANDB_*) come from a 0600 file, not from the command line that started us: a
# command line is readable by every user of the node (ps, /proc/*/cmdline), a mode-0600 file only by its owner.
# Only the names the launcher wrote there (LAUNCH_ENV_NAMES, from our own environment) are exported: a line planted
# in the file (LD_PRELOAD=..., PYTHONPATH=...) is never. The file must be a regular file of ours, not a link or a FIFO.
if [ -n "${LAUNCH_ENV_FILE:-}" ]; then
  if [ ! -f "$LAUNCH_ENV_FILE" ] || [ -L "$LAUNCH_ENV_FILE" ] || [ ! -O "$LAUNCH_ENV_FILE" ] || [ ! -r "$LAUNCH_ENV_FILE" ]; then
    echo "$tag error: cannot read the run's env file $LAUNCH_ENV_FILE on this node as a regular file of yours (the" \
      "launcher copies it there)" >&2
    record 2 0 "$EPOCHREALTIME"
    exit 2
  fi
  allowed=" ${LAUNCH_ENV_NAMES:-} "
  while IFS= read -r line; do
    name=${line%%=*}
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ && $allowed == *" $name "* ]] && export "$line"
  done < <(head -c 1048576 "$LAUNCH_ENV_FILE")
  unset line name allowed
fi

# Under DeepSpeed's pdsh runner the command comes as shell-quoted words in LAUNCH_RANK_CMD (launch/backends/deepspeed.py).
if [ $# -eq 0 ] && [ -n "${LAUNCH_RANK_CMD:-}" ]; then
  eval "set -- $LAUNCH_RANK_CMD"  # words quoted by shlex.quote: eval only removes that quoting
fi

# A stop only if the command was still running when the signal came (a zombie has ended): a rank that died on its own
# just before its peers were stopped is the failure, not a stopped rank.
running() {
  local stat
  if ! read -r stat 2>/dev/null <"/proc/$1/stat"; then  # gone (reaped); without /proc, ask kill -0
    if [ ! -d /proc/self ] && kill -0 "$1" 2>/dev/null; then return 0; fi
    return 1  # an explicit status: a bare `return` in a trap handler returns the status from before the trap
  fi
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}
stopped=0 pid=
on_signal() { if [ -z "$pid" ] || running "$pid"; then stopped=1; [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; fi; }
trap on_signal TERM INT HUP

# A keeper process runs the command and reports its pid, then its exit code and end time, through a pipe. It ignores
# TERM/INT/HUP, so its `wait` is never cut short: a trapped signal interrupting bash's own `wait` can lose the
# child's status (seen: a rank SIGKILLed just before torchrun stopped its group, recorded as exit 143, a stop). The
# command gets the default dispositions back. The prefixer ignores them too (an ignored signal stays ignored across
# exec): Slurm signals every process of a job step at once, and a prefixer gone first would make the rank's next
# print fail before it saves its checkpoint. It exits when the rank's output closes.
exec {chan}<> <(:)
(
  trap '' TERM INT HUP
  ( trap - TERM INT HUP; exec "$@" {chan}>&- ) > >(trap '' TERM INT HUP; exec sed -u "s/^/$tag /" {chan}>&-) 2>&1 &
  echo "$!" >&"$chan"
  wait "$!"; echo "$? $EPOCHREALTIME" >&"$chan"  # the end time first thing: the launcher orders failures by it
  wait 2>/dev/null  # let the prefixing sed flush the last lines
) &
keeper=$!
until read -r -u "$chan" pid; do :; done  # a trapped signal interrupts `read`: read again
[ "$stopped" -eq 0 ] || kill -TERM "$pid" 2>/dev/null  # a stop that came before the pid was known
until read -r -u "$chan" rc ended; do :; done
while kill -0 "$keeper" 2>/dev/null; do wait "$keeper"; done
record "$rc" "$stopped" "$ended"
# rc 143 = SIGTERM: a stop that came from the launcher or a peer's failure, never the root cause.
if [ "$rc" -ne 0 ] && [ "$stopped" -eq 0 ] && [ "$rc" -ne 143 ]; then
  echo "$tag exited on its own: exit=$rc" >&2
fi
exit "$rc"
