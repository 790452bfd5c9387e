"""Where the ranks of a local world meet: a TCP port on this machine for MASTER_PORT / a TCPStore."""
from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterator


# Linux's default ephemeral range starts at 32768 (net.ipv4.ip_local_port_range): below it, ports are given only to
# whoever names them, never to a bind(0) or to a connection's source port. 10000 keeps clear of well-known services.
_FIXED_PORTS = range(10000, 32768)


def free_port(host: str = "127.0.0.1") -> int:
    """A port bindable right now, below the ephemeral range: for a server its caller starts a moment later (sshd, a
    Slurm daemon, a launcher's --master-port). A port from bind(0) would be ephemeral, which any connection on the
    machine may take as its source port in the meantime; here only another explicit binder could. A local world's
    store takes `reserved_port`, which holds its port."""
    for _ in range(64):
        port = random.choice(_FIXED_PORTS)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # 64 taken in a row: a crowded machine; an ephemeral one is still free now
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def reserved_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port held for rank 0's TCPStore while the block runs. A port merely found free is taken now and then, before
    rank 0 binds it, by another process's connection (its ephemeral source port: seen in CI with 8-rank gloo worlds
    running side by side, rank 0 failing with EADDRINUSE). Here the port stays bound by this process, with
    SO_REUSEADDR and not listening: the kernel gives it to no other bind or connect, and the store (which sets
    SO_REUSEADDR itself, libuv or not) can still listen on it."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        yield s.getsockname()[1]
