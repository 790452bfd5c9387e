"""Where the ranks of a local world meet: a free TCP port on this machine for MASTER_PORT / a TCPStore."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free right now (bind to port 0). Another process may take it before it is used; the
    callers start their store at once."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
