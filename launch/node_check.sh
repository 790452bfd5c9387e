#!/usr/bin/env bash
# Runs ON one node (over ssh) for preflight; prints one `key=value` line per fact, never fails itself.
#   node_check.sh SLOTS DEVICE CHECKPOINT_DIR MARKER [DATA_PATH ...]
# MARKER: a file preflight wrote into CHECKPOINT_DIR from the launching host; seeing it here means the directory is
# shared with that host (every rank must see the same checkpoints for auto-resume).
set -u
slots=$1 device=$2 ckpt=$3 marker=$4
shift 4
echo "host=$(hostname)"
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
else
  echo "gpus=none"
fi
echo "slots=$slots device=$device"
if [ -n "$ckpt" ]; then
  probe="$ckpt/.preflight-write-test.$(hostname).$$"
  if mkdir -p "$ckpt" 2>/dev/null && touch "$probe" 2>/dev/null; then echo "ckpt_writable=yes"; rm -f "$probe"
  else echo "ckpt_writable=no"; fi
  if [ -e "$ckpt/$marker" ]; then echo "ckpt_shared=yes"; else echo "ckpt_shared=no"; fi
fi
for p in "$@"; do
  if [ -e "$p" ] || [ -e "$p.bin" ] || [ -e "$p.idx" ]; then echo "data_visible=yes $p"; else echo "data_visible=no $p"; fi
done
