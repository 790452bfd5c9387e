"""Where the ranks of a world meet. A local world (`train --local`, the engine ranks of reshape / import-hf /
export-hf, the measure tools) meets in a file store in a private directory and talks over loopback only
(`local_world`): torch's TCPStore listens on every interface of the machine whatever address it is given (checked
with torch 2.13: `*:PORT`), and anyone who can reach an unauthenticated store can join the world or feed tensors into
its collectives. A launcher's world spans machines: it meets on MASTER_ADDR:MASTER_PORT (`free_port` for the
launcher's --master-port), on a network the docs ask to keep private."""
from __future__ import annotations

import contextlib
import os
import random
import socket
import tempfile
from collections.abc import Iterator

STORE_ENV = "RECIPES_LOCAL_STORE"  # a local world's file store (recipes.train.engine.init_distributed reads it)


# Linux's default ephemeral range starts at 32768 (net.ipv4.ip_local_port_range): below it, ports are given only to
# whoever names them, never to a bind(0) or to a connection's source port. 10000 keeps clear of well-known services.
_FIXED_PORTS = range(10000, 32768)


def free_port(host: str = "127.0.0.1") -> int:
    """A port bindable right now, below the ephemeral range: for a server its caller starts a moment later (sshd, a
    Slurm daemon, a launcher's --master-port). A port from bind(0) would be ephemeral, which any connection on the
    machine may take as its source port in the meantime; here only another explicit binder could."""
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
def local_world(world: int) -> Iterator[dict]:
    """The environment of the ranks of a `world`-rank world on this machine (their RANK and LOCAL_RANK are the
    caller's): a file store in a fresh 0700 directory removed afterwards, gloo on loopback. No port is opened on any
    interface but loopback, and none at all for the rendezvous."""
    with tempfile.TemporaryDirectory(prefix="recipes-world-") as d:
        os.chmod(d, 0o700)
        yield {STORE_ENV: os.path.join(d, "store"), "GLOO_SOCKET_IFNAME": "lo", "WORLD_SIZE": str(world),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1"}
