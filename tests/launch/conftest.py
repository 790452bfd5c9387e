"""A real sshd on loopback for the launcher tests: temporary host and user keys, a free non-default port, root login
by key only. Two host aliases (node1 -> 127.0.0.1, node2 -> 127.0.0.2) live in an ssh_config file that the launch
scripts are pointed at with LAUNCH_SSH_CONFIG."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.launch.launch_helpers import REPO, SSHD, TOY, free_port, launch_env, wait_for_ssh


@pytest.fixture(scope="session")
def ssh_cluster(tmp_path_factory):
    """Yields (ssh_config path, hostfile path with node1 slots=2 / node2 slots=2)."""
    if not os.path.exists(SSHD):
        pytest.fail("sshd is not installed: run launch/install_system_deps.sh (apt-get install openssh-server pdsh)")
    d = tmp_path_factory.mktemp("sshd")
    port = free_port()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "user_key")], check=True)
    shutil.copy(d / "user_key.pub", d / "authorized_keys")
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nListenAddress 127.0.0.2\nHostKey {d / 'host_key'}\n"
        f"PidFile {d / 'sshd.pid'}\nAuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "MaxStartups 100:30:200\nMaxSessions 100\nLogLevel ERROR\n"
    )
    user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    config = d / "ssh_config"
    config.write_text("".join(
        f"Host {alias}\n  HostName {addr}\n  Port {port}\n  User {user}\n  IdentityFile {d / 'user_key'}\n"
        "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        for alias, addr in (("node1", "127.0.0.1"), ("node2", "127.0.0.2"))
    ))
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL,
                            stderr=open(d / "sshd.log", "w"))
    try:
        deadline = time.time() + 20
        wait_for_ssh(config, "node1", deadline)
        wait_for_ssh(config, "node2", deadline)
        hostfile = d / "hostfile"
        hostfile.write_text("# two loopback 'nodes'\nnode1 slots=2\n\nnode2 slots=2  # second node\n")
        yield config, hostfile
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def local_reference(tmp_path_factory):
    """Losses of the toy recipe trained in ONE process on the whole global batch (no launcher, no ssh): what every
    multi-node launch of the toy must reproduce up to float summation order."""
    out = tmp_path_factory.mktemp("ref") / "losses.json"
    env = launch_env(TOY_OUT=out, RANK=0, WORLD_SIZE=1, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(),
                     PYTHONPATH=REPO)
    r = subprocess.run([str(REPO / ".venv" / "bin" / "python"), str(REPO / "tests" / "launch" / "toy_train.py"),
                        "--config", str(TOY)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["world_size"] == 1 and len(data["losses"]) == 4
    return data["losses"]
