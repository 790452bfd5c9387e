"""The Ray executor: each unit is one Ray task (1 CPU, retried twice if its worker dies).

Joins the cluster named by ``address`` (``--ray-address``: e.g. auto, ray://head:10001) or starts a private local
instance of ``workers`` CPUs (and stops it after the run, or after the command's last run: ``choose.session``).
Every Ray node must import data_prep from the same environment (the package installed in the venv, on a shared file
system) and see the inputs and the output directory at the same paths.

A Ray cluster runs whatever code anyone who reaches it submits, as the user who started it. So the local instance
is private (docs/cluster.md, "What must be trusted"):
- it listens on loopback only: Ray binds its servers to the address it advertises, and advertises the node's network
  address unless it believes it is a single-machine install, which ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` tells it
  (read when ray is imported: set before the import here, and checked after the start);
- it requires Ray's token authentication (``RAY_AUTH_MODE=token``, Ray >= 2.5x) with a random token of this process
  passed in the environment only (Ray's default would store one in ~/.ray/auth_token, readable per the umask);
- its session directory (logs, sockets, the address file ``address="auto"`` looks for) is a fresh 0700 temporary
  directory instead of the shared, world-writable /tmp/ray;
- ``RAY_ADDRESS`` in the environment is not followed: a cluster is joined only when ``--ray-address`` names it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import shutil
import sys
import tempfile
from typing import Optional

from data_prep import file_modes
from data_prep.executors.base import Executor

log = logging.getLogger(__name__)

# One thread per task: the tasks are the parallelism.
TASK_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray advertises (and binds) loopback
_AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
_TOKEN: Optional[str] = None  # one per process: Ray's token loader caches the first token it reads


def _call(task, unit, file_mode=None):
    file_modes.apply(file_mode)  # a worker on another node does not inherit the driver's umask
    return task(unit)


def _process_token() -> str:
    global _TOKEN
    if _TOKEN is None:
        _TOKEN = secrets.token_hex(32)  # 256 bits, as Ray's own generator
    return _TOKEN


def is_loopback(address: str) -> bool:
    """'127.0.0.1:6379', 'ray://[::1]:10001', 'localhost' -> True; a network address or another name -> False."""
    rest = address.rpartition("://")[2]
    if rest.startswith("["):  # [IPv6]:port
        host = rest[1:rest.find("]")]
    else:
        host = rest.split(":")[0] if rest.count(":") == 1 else rest  # host:port, or a bare IPv6 address / name
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refuse_implicit_address(address: Optional[str]) -> None:
    """Without ``--ray-address``, ray.init would follow ``RAY_ADDRESS`` from the environment to whatever cluster it
    names (a profile, a job script, another user's export): joining a cluster is asked for on the command line."""
    implicit = os.environ.get("RAY_ADDRESS")
    if address is None and implicit:
        raise ValueError(f"RAY_ADDRESS={implicit} is set but --ray-address is not: data_prep joins a Ray cluster only "
                         "when --ray-address names it (a Ray cluster runs the code of anyone who can reach it); pass "
                         f"--ray-address {implicit} to join that cluster, or unset RAY_ADDRESS to start a private "
                         "local one")


@contextlib.contextmanager
def private_cluster_env():
    """The environment a private local Ray instance starts with (see the module docstring), restored afterwards;
    yields its session directory (0700, removed afterwards)."""
    saved = {k: os.environ.get(k) for k in (SINGLE_MACHINE_ENV, *_AUTH_ENV)}
    # Ray makes its temp directory mode 0777 whatever it was: a 0700 parent keeps other users out of all of it.
    # Short names: Ray's unix socket paths live under it (108-byte limit).
    private = tempfile.mkdtemp(prefix="ray-")
    os.environ.update({SINGLE_MACHINE_ENV: "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": _process_token()})
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    try:
        yield os.path.join(private, "r")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(private, ignore_errors=True)


def _start_private(ray, workers: int, temp_dir: str) -> None:
    ray.init(address="local", num_cpus=max(1, workers), _temp_dir=temp_dir, runtime_env={"env_vars": TASK_ENV},
             log_to_driver=False, include_dashboard=False, configure_logging=False)
    gcs = ray.get_runtime_context().gcs_address
    if not is_loopback(gcs):  # ray was imported before SINGLE_MACHINE_ENV could take effect
        ray.shutdown()
        raise RuntimeError(f"the local Ray instance listens on {gcs}, not on loopback: ray was imported before "
                           f"data_prep could ask for a single-machine instance; set {SINGLE_MACHINE_ENV}=0 before "
                           "ray is imported, or start a cluster yourself and pass --ray-address")


def _join(ray, address: str) -> None:
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token" and not is_loopback(address):
        log.warning(f"joining the Ray cluster at {address} without Ray token authentication (RAY_AUTH_MODE is not "
                    "'token'): anyone who can reach it runs code as its user; see docs/cluster.md")
    ray.init(address=address, runtime_env={"env_vars": TASK_ENV}, log_to_driver=False, include_dashboard=False,
             configure_logging=False)


class RayExecutor(Executor):
    """``keep``: the private instance (and the environment it needs) stays up between runs until ``close``
    (``choose.session``); otherwise each run starts and stops its own."""

    def __init__(self, workers: int, address: Optional[str] = None, keep: bool = False):
        refuse_implicit_address(address)
        self.workers, self.address = workers, address
        self._kept = contextlib.ExitStack() if keep else None

    def run(self, task, units, on_result, bar) -> None:
        with contextlib.ExitStack() as this_run:
            ray = self._started(self._kept if self._kept is not None else this_run)
            self._run_tasks(ray, task, units, on_result)

    def close(self) -> None:
        if self._kept is not None:
            self._kept.close()

    def _started(self, stack: contextlib.ExitStack):
        """ray, initialized: by this executor (its stop and environment's restore pushed on ``stack``) unless it
        already was (an earlier run kept in a session, or the caller's own ray.init)."""
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            return sys.modules["ray"]
        temp_dir = stack.enter_context(private_cluster_env()) if self.address is None else None
        try:
            import ray  # after private_cluster_env: Ray reads SINGLE_MACHINE_ENV at import
        except ImportError as e:
            raise RuntimeError("--executor ray needs the ray package (pip install ray, as pinned in "
                               "requirements.txt)") from e
        _start_private(ray, self.workers, temp_dir) if temp_dir else _join(ray, self.address)
        stack.callback(ray.shutdown)
        return ray

    @staticmethod
    def _run_tasks(ray, task, units, on_result) -> None:
        remote = ray.remote(num_cpus=1, max_retries=2)(_call)
        mode = file_modes.current()
        refs = {remote.remote(task, u, mode): u for u in units}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for r in ready:
                on_result(refs[r], ray.get(r))
