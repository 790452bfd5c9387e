"""Run as a script by test_dp_ray_security.py: the Ray executor's private local instance, looked at from outside.

One Ray task reports the instance's GCS address; while the instance is still up (``on_result`` runs in this driver),
a second process with none of this process's Ray variables and an empty HOME (another user of the node, or of the
network) asks the GCS for its node list over plain gRPC, and a TCP connection is tried at the node's network
address. Prints one JSON object. A script (``__main__``) so that Ray pickles the probe by value."""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile

from data_prep.executors.ray import RayExecutor

ASK_GCS = """
import sys, grpc
from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
with grpc.insecure_channel(sys.argv[1]) as channel:
    try:
        reply = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetAllNodeInfo(
            gcs_service_pb2.GetAllNodeInfoRequest(), timeout=120)
        print("ANSWERED", len(reply.node_info_list))
    except grpc.RpcError as e:
        print("REFUSED", e.code().name)
"""


def gcs_address(unit):
    import ray

    return ray.get_runtime_context().gcs_address


def network_ip() -> str | None:
    """This node's address on its default route (no packet is sent), or None with loopback only."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # TEST-NET-2: routed like any address
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def tcp_open(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=10).close()
        return True
    except OSError:
        return False


def look_from_outside(gcs: str, home: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = home
    asked = subprocess.run([sys.executable, "-c", ASK_GCS, gcs], env=env, capture_output=True, text=True, timeout=300)
    port = int(gcs.rsplit(":", 1)[1])
    ip = network_ip()
    tmp = tempfile.gettempdir()
    return {"gcs": gcs, "unauthenticated_client": (asked.stdout + asked.stderr).strip().splitlines()[-1:],
            "network_ip": ip, "gcs_open_on_network_ip": tcp_open(ip, port) if ip else None,
            "session_dirs": {d: oct(stat.S_IMODE(os.stat(os.path.join(tmp, d)).st_mode)) for d in os.listdir(tmp)}}


def main() -> None:
    seen = []
    RayExecutor(1).run(gcs_address, [0], lambda unit, gcs: seen.append(look_from_outside(gcs, sys.argv[1])), None)
    print(json.dumps(seen[0]))


if __name__ == "__main__":
    main()
