"""A private sshd on loopback with temporary keys, and an ssh_config of host aliases for it (LAUNCH_SSH_CONFIG).

Lets the tests (and benchmarks) run the ssh-based launch scripts on one machine: each alias is a "node" on its own
loopback address. Needs root (sshd drops privileges per session; root login by key only) and /usr/sbin/sshd.

As a command, it runs another one with two loopback nodes set up, LAUNCH_SSH_CONFIG and LAUNCH_HOSTFILE exported:
    python tests/support/loopback_ssh.py [--slots N] -- python -m data_prep bench-executors /tmp/be -j 2
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, Optional

from recipes.parallel.rendezvous import free_port

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def unavailable() -> Optional[str]:
    """Why a loopback sshd cannot be started here, or None if it can."""
    if not os.path.exists(SSHD):
        return f"{SSHD} is missing (apt-get install openssh-server, or launch/install_system_deps.sh)"
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        return "ssh / ssh-keygen are missing (apt-get install openssh-client)"
    return None



def _wait(config: str, host: str, deadline: float) -> None:
    last = ""
    while time.time() < deadline:
        r = subprocess.run(["ssh", "-F", config, "-o", "BatchMode=yes", host, "echo", "ready"],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if r.stdout.strip() == "ready":
            return
        last = r.stderr
        time.sleep(0.2)
    raise RuntimeError(f"sshd on loopback never answered for {host}: {last.strip()}")


@contextlib.contextmanager
def loopback_sshd(d: str, aliases: Dict[str, str], unreachable: Optional[Dict[str, str]] = None) -> Iterator[str]:
    """Start sshd listening on every address in ``aliases`` (alias -> 127.0.0.x); yield the ssh_config path.
    ``unreachable`` aliases get config entries but no listener: a dead node, for failure tests."""
    os.makedirs(d, exist_ok=True)
    port = free_port()  # a non-default port: never collides with a system sshd on 22
    for k in ("host_key", "user_key"):
        for p in (k, k + ".pub"):  # ssh-keygen asks before overwriting: start from nothing
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(d, p))
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(d, k)], check=True)
    shutil.copy(os.path.join(d, "user_key.pub"), os.path.join(d, "authorized_keys"))
    listen = "".join(f"ListenAddress {a}\n" for a in sorted(set(aliases.values())))
    with open(os.path.join(d, "sshd_config"), "w") as f:
        # StrictModes no: the temporary directory's permissions are not what sshd demands of a home directory.
        f.write(f"Port {port}\n{listen}HostKey {d}/host_key\nPidFile {d}/sshd.pid\n"
                f"AuthorizedKeysFile {d}/authorized_keys\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "MaxStartups 100:30:200\nMaxSessions 100\nLogLevel ERROR\n")
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    config = os.path.join(d, "ssh_config")
    with open(config, "w") as f:
        # Throwaway host key: no known_hosts entry to check against or to leave behind.
        f.write("".join(f"Host {alias}\n  HostName {addr}\n  Port {port}\n  User {user}\n  IdentityFile {d}/user_key\n"
                        "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                        "  LogLevel ERROR\n" for alias, addr in {**aliases, **(unreachable or {})}.items()))
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory; absent where no sshd ever ran
    with open(os.path.join(d, "sshd.log"), "w") as log:
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", os.path.join(d, "sshd_config")],
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.time() + 20
        for alias in aliases:
            _wait(config, alias, deadline)
        yield config
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="run COMMAND with two loopback ssh nodes (loop1, loop2) in "
                                             "LAUNCH_HOSTFILE and LAUNCH_SSH_CONFIG")
    ap.add_argument("--slots", type=int, default=1, help="slots of each node in the hostfile")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give the command after --")
    why_not = unavailable()
    if why_not:
        print(f"cannot start a loopback sshd: {why_not}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="loopback_sshd_") as d:
        with loopback_sshd(d, {"loop1": "127.0.0.1", "loop2": "127.0.0.2"}) as config:
            hostfile = os.path.join(d, "hostfile")
            with open(hostfile, "w") as f:
                f.write(f"loop1 slots={a.slots}\nloop2 slots={a.slots}\n")
            env = dict(os.environ, LAUNCH_SSH_CONFIG=config, LAUNCH_HOSTFILE=hostfile)
            env.pop("LAUNCH_SSH_SHIM", None)  # a parent launch script's ssh wrapper would point at another config
            return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
