"""Ports for rendezvous (recipes.parallel.rendezvous). The one a local world's rank 0 listens on is held from the
moment it is chosen: no other process can bind it, the OS hands it to no one else, and torch's TCPStore still listens
on it. One for a server started later lies below the kernel's ephemeral range, which connections draw from."""
from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from recipes.parallel.rendezvous import free_port, reserved_port

pytestmark = pytest.mark.unit


def test_a_reserved_port_is_refused_to_other_binds():
    with reserved_port() as port, socket.socket() as other:
        with pytest.raises(OSError) as e:
            other.bind(("127.0.0.1", port))
        assert "in use" in str(e.value)


def test_the_os_hands_a_reserved_port_to_no_one_else():
    with reserved_port() as port:
        handed = set()
        for _ in range(3000):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                handed.add(s.getsockname()[1])
        assert port not in handed and len(handed) > 100


@pytest.mark.parametrize("libuv", [True, False], ids=["libuv store", "classic store"])
def test_rank_zeros_store_listens_on_the_reserved_port(libuv):
    with reserved_port() as port:
        server = TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=10), use_libuv=libuv)
        server.set("rank0", "here")
        client = TCPStore("127.0.0.1", port, 1, False, timeout=timedelta(seconds=10))
        assert client.get("rank0") == b"here"
        del client, server


def test_a_free_port_is_below_the_ephemeral_range_and_bindable():
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(p < low for p in ports) and len(ports) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))
