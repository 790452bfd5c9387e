"""Where ranks meet (recipes.parallel.rendezvous): a local world listens on loopback only (a file store, gloo on lo);
a port for a server started later lies below the kernel's ephemeral range, which connections draw from."""
from __future__ import annotations

import socket

import pytest

from recipes.parallel.rendezvous import free_port



@pytest.mark.multiproc
def test_a_local_world_listens_on_loopback_only(tmp_path):
    """`train --local 2`: no socket of the launcher or its ranks listens on anything but loopback (torch's TCPStore
    listens on every interface, so a local world meets in a file store and gloo binds to lo). Seen while the run
    trains, then the run is stopped."""
    import subprocess
    import time

    import psutil

    from tests.support.corpus import write_corpus
    from tests.support.runs import kill_group, pretrain_cmd, worker_env

    manifest = write_corpus(tmp_path / "corpus", shards=1, max_bytes=100_000)
    cmd = pretrain_cmd(2, f"data.manifests=[{manifest}]", f"checkpoint.dir={tmp_path / 'ck'}",
                       "training.train_steps=100000", "checkpoint.save_interval=100000", "parallel.pp=2")
    proc = subprocess.Popen(cmd, env=worker_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        metrics = tmp_path / "ck" / "logs" / "metrics.jsonl"
        deadline = time.time() + 240
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2) and time.time() < deadline:
            assert proc.poll() is None, "the run ended"
            time.sleep(0.5)
        pids = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)} | {proc.pid}
        listening = [c.laddr for c in psutil.net_connections("inet") if c.pid in pids and c.status == "LISTEN"]
        assert listening, "the ranks' gloo listeners should be seen"
        assert all(a.ip in ("127.0.0.1", "::1") for a in listening), listening
    finally:
        kill_group(proc)


@pytest.mark.unit
def test_a_free_port_is_below_the_ephemeral_range_and_bindable():
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(p < low for p in ports) and len(ports) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))
