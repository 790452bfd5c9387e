"""Ctrl-C of launch/prep.sh stops the tokenize processes it started on every node over ssh (real sshd on loopback):
none is left writing shards after the stop grace, so a rerun cannot race a live writer."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.launch import REPO, launch_env

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(240)]


def _tokenize_pids(out: Path) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if p.name.isdigit() and b"data_prep" in cmd and b"tokenize" in cmd and str(out).encode() in cmd \
                and b"--merge-only" not in cmd:
            pids.append(int(p.name))
    return pids


def test_ctrl_c_stops_remote_tokenize(ssh_cluster, tmp_path):
    config, hostfile = ssh_cluster
    from data_prep.steps.train_tokenizer import train

    texts = [f"document {i} " + "some words of text that repeat " * 40 for i in range(200)]
    (tmp_path / "sample.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    model = train([str(tmp_path / "sample.jsonl")], str(tmp_path / "sp"), vocab_size=300, threads=1, quiet=True)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    line = "".join(json.dumps({"text": t + str(k)}) + "\n" for k, t in enumerate(texts))
    for i in range(4):  # enough text for tokenize to run a while on every node
        (corpus / f"part{i}.jsonl").write_text(line * 150)
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
