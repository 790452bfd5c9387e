#!/usr/bin/env bash
# System packages the launcher and its tests use: ssh client + server (the tests start a private sshd on loopback)
# and pdsh (DeepSpeed's default multi-node runner). Idempotent and quiet; needs root (or sudo) and apt.
set -euo pipefail
need=()
command -v ssh >/dev/null || need+=(openssh-client)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v pdsh >/dev/null || need+=(pdsh)
[ ${#need[@]} -gt 0 ] || exit 0
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "installed: ${need[*]}"
