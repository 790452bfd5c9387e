"""Ctrl-C of launch/prep.sh stops the tokenize processes it started on every node over ssh (real sshd on loopback):
none is left writing shards after the stop grace, so a rerun cannot race a live writer."""
import os
import signal
import subprocess
import time

import pytest

from tests.support.launch import REPO, big_prep_corpus, launch_env
from tests.support.launch import tokenize_pids as _tokenize_pids

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(240)]


def test_ctrl_c_stops_remote_tokenize(ssh_cluster, tmp_path):
    config, hostfile = ssh_cluster
    corpus, model = big_prep_corpus(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", str(REPO / "launch" / "prep.sh"), "--hostfile", str(hostfile), "--log-dir",
                             str(tmp_path / "logs"), "--", str(corpus), "-o", str(out), "-t", model, "--no-fast-path",
                             "--shard-size", "16M"],  # several units, so every node has a slice to work on
                            cwd=tmp_path, env=launch_env(LAUNCH_SSH_CONFIG=config), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        while len(_tokenize_pids(out)) < 2:
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        proc.communicate(timeout=60)
        deadline = time.time() + 5 + 30  # stop grace + 30 s
        while _tokenize_pids(out) and time.time() < deadline:
            time.sleep(0.5)
        assert not _tokenize_pids(out), "tokenize still running on a node after Ctrl-C of prep.sh"
    finally:
        for p in _tokenize_pids(out):
            os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
