"""The Ray executor's local instance is private: loopback only, Ray's token authentication on (even when the user's
environment turns it off), its token in no file, its session directory 0700 and removed; a cluster is joined only
when --ray-address names it (issue 25, item 3)."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tests.support.data_prep import REPO, run_cli

from data_prep.executors.ray import is_loopback

PROBE = Path(__file__).with_name("ray_probe.py")


@pytest.mark.multiproc
def test_local_ray_instance_is_loopback_only_and_refuses_an_unauthenticated_client(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    tmpdir = tempfile.mkdtemp(prefix="t", dir="/tmp")  # short: Ray's unix socket paths live under TMPDIR
    try:
        # RAY_AUTH_MODE=disabled: a user who took Ray's "set RAY_AUTH_MODE=disabled to opt out" advice
        env = dict(os.environ, HOME=str(home), TMPDIR=tmpdir, RAY_AUTH_MODE="disabled")
        env.pop("RAY_ADDRESS", None)
        r = subprocess.run([sys.executable, str(PROBE), str(tmp_path / "outsider_home")], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        seen = json.loads(r.stdout.strip().splitlines()[-1])
        assert is_loopback(seen["gcs"]), seen  # advertised (and bound) on loopback, not the node's network address
        assert seen["unauthenticated_client"] == ["REFUSED UNAUTHENTICATED"], seen
        if seen["network_ip"]:  # a node with only loopback has no network address to try
            assert seen["gcs_open_on_network_ip"] is False, seen
        assert list(seen["session_dirs"].values()) == ["0o700"], seen  # one private session root while it ran
        assert os.listdir(tmpdir) == []  # and removed after the run
        assert not (home / ".ray").exists()  # the token was in no file
    finally:
        os.rmdir(tmpdir)


@pytest.mark.unit
def test_ray_address_in_the_environment_is_not_followed_without_the_flag(tmp_path, corpus_dir, sp_model):
    r = run_cli("tokenize", corpus_dir, "-o", tmp_path / "o", "-t", sp_model, "--executor", "ray", check=False,
                env_extra={"RAY_ADDRESS": "10.0.0.7:6379"})
    assert r.returncode == 2, r.stderr
    assert "RAY_ADDRESS=10.0.0.7:6379 is set but --ray-address is not" in r.stderr
    assert "pass --ray-address 10.0.0.7:6379" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.unit
@pytest.mark.parametrize("address,loopback", [("127.0.0.1:6379", True), ("ray://127.0.0.1:10001", True),
                                              ("[::1]:6379", True), ("localhost:6379", True),
                                              ("10.0.0.7:6379", False), ("ray://head:10001", False),
                                              ("auto", False), ("[2001:db8::1]:6379", False)])
def test_loopback_addresses(address, loopback):
    assert is_loopback(address) is loopback
