"""The Ray executor: each unit is one Ray task (1 CPU, retried twice if its worker dies).

Joins the cluster at ``address`` (e.g. auto, ray://head:10001) or starts a local instance of ``workers`` CPUs (and
stops it after the run). Every Ray node must import data_prep from the same environment (the package installed in
the venv, on a shared file system) and see the inputs and the output directory at the same paths.
"""

from __future__ import annotations

from typing import Optional

from data_prep.executors.base import Executor

# One thread per task: the tasks are the parallelism.
TASK_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}


def _call(task, unit):
    return task(unit)


class RayExecutor(Executor):
    def __init__(self, workers: int, address: Optional[str] = None):
        self.workers, self.address = workers, address

    def run(self, task, units, on_result, bar) -> None:
        try:
            import ray
        except ImportError as e:
            raise RuntimeError("--executor ray needs the ray package (pip install ray, as pinned in "
                               "requirements.txt)") from e
        started = not ray.is_initialized()
        if started:
            kw = {"address": self.address} if self.address else {"num_cpus": max(1, self.workers)}
            ray.init(runtime_env={"env_vars": TASK_ENV}, log_to_driver=False, include_dashboard=False,
                     configure_logging=False, **kw)
        try:
            remote = ray.remote(num_cpus=1, max_retries=2)(_call)
            refs = {remote.remote(task, u): u for u in units}
            pending = list(refs)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
                for r in ready:
                    on_result(refs[r], ray.get(r))
        finally:
            if started:
                ray.shutdown()
