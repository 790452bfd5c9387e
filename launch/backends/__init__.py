"""The back ends, each a class that only renders what to run from the launch's data (launch.backends.base.Launch):
    local         torchrun on this machine
    torchrun_ssh  one torchrun per node over ssh (static rendezvous)
    deepspeed     DeepSpeed's runner over pdsh (its env file, hostfile and world info)
    slurm         an sbatch script (one torchrun per node under srun), requeue-safe
The supervisor (launch/supervise.py) starts what they render; a new back end (a container wrapper, Slurm without a
hostfile) is one more class here."""
from __future__ import annotations

from launch.backends.base import Backend


def make(name: str, ssh=None) -> Backend:
    from launch.backends.deepspeed import DeepSpeed
    from launch.backends.local import Local
    from launch.backends.slurm import Slurm
    from launch.backends.torchrun_ssh import TorchrunSsh

    return {"local": Local, "torchrun-ssh": TorchrunSsh, "deepspeed": DeepSpeed, "slurm": Slurm}[name](ssh)
