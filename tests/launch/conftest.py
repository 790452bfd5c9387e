"""A real sshd on loopback for the launcher tests: temporary host and user keys, a free non-default port, root login
by key only. Two host aliases (node1 -> 127.0.0.1, node2 -> 127.0.0.2) live in an ssh_config file that the launch
scripts are pointed at with LAUNCH_SSH_CONFIG."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.loopback_ssh import loopback_sshd
from tests.support.launch import REPO, SSHD, TOY, free_port, launch_env


@pytest.fixture(scope="session")
def ssh_cluster(tmp_path_factory):
    """Yields (ssh_config path, hostfile path with node1 slots=2 / node2 slots=2)."""
    if not os.path.exists(SSHD):
        pytest.fail("sshd is not installed: run launch/install_system_deps.sh (apt-get install openssh-server pdsh)")
    d = tmp_path_factory.mktemp("sshd")
    with loopback_sshd(str(d), {"node1": "127.0.0.1", "node2": "127.0.0.2"}) as config:
        hostfile = d / "hostfile"
        hostfile.write_text("# two loopback 'nodes'\nnode1 slots=2\n\nnode2 slots=2  # second node\n")
        yield Path(config), hostfile


@pytest.fixture(scope="session")
def local_reference(tmp_path_factory):
    """Losses of the toy recipe trained in ONE process on the whole global batch (no launcher, no ssh): what every
    multi-node launch of the toy must reproduce up to float summation order."""
    out = tmp_path_factory.mktemp("ref") / "losses.json"
    env = launch_env(TOY_OUT=out, RANK=0, WORLD_SIZE=1, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    r = subprocess.run([str(REPO / ".venv" / "bin" / "python"), str(REPO / "tests" / "launch" / "toy_train.py"),
                        "--config", str(TOY)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["world_size"] == 1 and len(data["losses"]) == 4
    return data["losses"]


@pytest.fixture
def launch_here(capsys, monkeypatch):
    """`launch/SCRIPT ARGS` (train.sh or preflight.sh) run in this process through `launch.cli.run` (the code behind
    the shims, less the signal handlers): for dry runs and refusals, which start nothing; a subprocess per call would
    cost the unit tier a second each. Same environment rules as `launch_env`; returns a CompletedProcess."""
    from launch.cli import run

    for var in ("LAUNCH_SSH_CONFIG", "LAUNCH_HOSTFILE", "LAUNCH_SLURM_GRACE", "MASTER_ADDR", "MASTER_PORT", "RANK",
                "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LAUNCH_STOP_GRACE", "5")

    def launch(script, *args):
        capsys.readouterr()
        rc = run([{"train.sh": "train", "preflight.sh": "preflight"}[script], *map(str, args)])
        out = capsys.readouterr()
        return subprocess.CompletedProcess([script, *args], rc, out.out, out.err)

    return launch
