"""What every back end renders from (Launch), what the supervisor starts (Spawn), and the interface."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from launch.plan import NodePlan
from launch.slurm_request import SlurmRequest


def quote_words(words) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


@dataclass
class Spawn:
    """One process the supervisor starts for an attempt."""
    name: str                              # its log: LOG_DIR/<name>.log (a host, or "deepspeed-runner")
    argv: list[str]
    env: dict[str, str] | None = None      # the whole environment; None: the launcher's
    cwd: str | None = None
    own_session: bool = False              # out of the terminal's process group (Ctrl-C reaches only the launcher)
    demux_hosts: tuple[str, ...] = ()      # pdsh output: `host: text` lines go to that host's log


@dataclass
class Launch:
    """A run's data: every back end renders its commands (or its job script) from this alone."""
    run_id: str
    log_dir: Path
    plan: NodePlan
    master_port: int
    env_lines: list[str]                   # launch.env: NAME=VALUE, nothing secret
    rank_cmd: list[str]                    # rank_exec.sh, the entry, --config RECIPE, the overrides
    secret_names: list[str]
    repo: str
    venv: str
    python: str
    layout: str = ""
    device: str = "cpu"
    master_addr_opt: str = ""              # --master-addr as given ("" = derived)
    slurm_grace_s: int = 300
    slurm: SlurmRequest | None = None      # --backend slurm: what the job asks for (partition, time, container...)
    # repo, venv and python above are the ranks' (inside a container: the image's); the launcher's own, where the
    # Slurm job script runs its bookkeeping (outside any container), when they differ:
    launcher_repo: str = ""
    launcher_python: str = ""
    attempt: int = 0                       # 0: no attempt yet (a dry run, a Slurm job script)
    attempt_dir: Path | None = None

    @property
    def nodes(self):
        return self.plan.nodes

    def attempt_env(self) -> list[str]:
        """Per attempt: its number, where the ranks write heartbeats, stack dumps and their exit records."""
        if self.attempt_dir is None:
            return []
        d = self.attempt_dir
        return [f"LAUNCH_ATTEMPT={self.attempt}", f"LAUNCH_HEARTBEAT_DIR={d / 'heartbeat'}",
                f"LAUNCH_STACKS_DIR={d / 'stacks'}", f"LAUNCH_EXIT_DIR={d / 'exits'}"]

    def torchrun(self) -> str:
        return f"{self.venv}/bin/torchrun"

    def node_head(self, i: int) -> str:
        first, last = self.plan.rank_range(i)
        n = self.nodes[i]
        return f"node {i} {n.host} slots={n.slots} ranks={first}-{last}"


class Backend:
    name = ""

    def __init__(self, ssh=None):
        self.ssh = ssh

    def check(self, launch: Launch, starting: bool) -> None:
        """Refusals specific to this back end (LaunchError), before anything is written or started."""

    def env_extra(self, launch: Launch) -> list[str]:
        """More NAME=VALUE lines every rank gets from this back end."""
        return []

    def files(self, launch: Launch) -> dict[str, str]:
        """Files to write into the log dir, again for every attempt."""
        return {}

    def spawns(self, launch: Launch) -> list[Spawn]:
        raise NotImplementedError

    def plan_lines(self, launch: Launch) -> list[str]:
        """The dry run's lines: what runs on each node."""
        return [launch.node_head(i) for i in range(len(launch.nodes))]
