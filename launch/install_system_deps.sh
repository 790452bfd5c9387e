#!/usr/bin/env bash
# System packages the launcher and its tests use: ssh client + server (the tests start a private sshd on loopback),
# pdsh (DeepSpeed's default multi-node runner), and Slurm + munge (the tests start a private one-node Slurm,
# tests/support/slurm.py; nothing is enabled or started here), with Slurm's headers and a C compiler for a test
# SPANK plugin. Idempotent and quiet; needs root (or sudo) and apt.
set -euo pipefail
need=()
command -v ssh >/dev/null || need+=(openssh-client)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v pdsh >/dev/null || need+=(pdsh)
{ [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v sbatch >/dev/null; } || need+=(slurm-wlm)
[ -x /usr/sbin/munged ] || need+=(munge)
# the Slurm tests build a small SPANK plugin (a pyxis stand-in, tests/support/spank_container_standin.c)
[ -e /usr/include/slurm/spank.h ] || need+=(libslurm-dev)
command -v cc >/dev/null || need+=(gcc libc6-dev)
[ ${#need[@]} -gt 0 ] || exit 0
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
# Packages only: Debian would start munged/slurmctld/sshd as system services on install; policy-rc.d (exit 101 =
# "not now") stops that for this install, so nothing keeps running that the tests did not start themselves.
rcd=/usr/sbin/policy-rc.d
own_rcd=0
if [ ! -e "$rcd" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$rcd" >/dev/null && $SUDO chmod 755 "$rcd" && own_rcd=1
fi
trap 'rm -f "$log"; [ "$own_rcd" = 0 ] || $SUDO rm -f "$rcd"' EXIT
# Quiet on success; the whole apt output when something fails.
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "install_system_deps: could not install ${need[*]}; the launcher tests need them (ssh, sshd, pdsh, slurmctld/slurmd/munged)" >&2
  exit 1
fi
echo "installed: ${need[*]}"
