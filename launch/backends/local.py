"""--backend local: torchrun on this machine, started without a shell (its environment given as data)."""
from __future__ import annotations

import os

from launch.backends import torchrun
from launch.backends.base import Backend, Launch, Spawn, quote_words


def node_env(launch: Launch, i: int) -> list[str]:
    """NAME=VALUE words for node i: launch.env, the attempt's dirs, the host name, its devices."""
    return launch.env_lines + launch.attempt_env() + [f"LAUNCH_HOST={launch.nodes[i].host}"] + \
        torchrun.devices_env(launch, i)


def shell_line(launch: Launch, i: int) -> str:
    """What runs on node i, as one shell line (every word quoted once)."""
    return (f"cd {quote_words([launch.repo])} && exec env {quote_words(node_env(launch, i))} "
            f"{quote_words(torchrun.args(launch, i))} {quote_words(launch.rank_cmd)}")


class Local(Backend):
    name = "local"

    def spawns(self, launch: Launch) -> list[Spawn]:
        env = dict(os.environ)
        env.update(line.split("=", 1) for line in node_env(launch, 0))
        return [Spawn(launch.nodes[0].host, torchrun.args(launch, 0) + launch.rank_cmd, env=env, cwd=launch.repo)]

    def plan_lines(self, launch: Launch) -> list[str]:
        return [f"{launch.node_head(0)}: {shell_line(launch, 0)}"]
