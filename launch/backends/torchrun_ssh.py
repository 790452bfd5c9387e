"""--backend torchrun-ssh: one torchrun per node, each started over ssh with its whole environment on its command
line (nothing secret is in it: the user's variables travel in the 0600 env file)."""
from __future__ import annotations

from launch.backends.base import Backend, Launch, Spawn
from launch.backends.local import shell_line


class TorchrunSsh(Backend):
    name = "torchrun-ssh"

    def spawns(self, launch: Launch) -> list[Spawn]:
        return [Spawn(n.host, self.ssh.argv(n.host, shell_line(launch, i))) for i, n in enumerate(launch.nodes)]

    def plan_lines(self, launch: Launch) -> list[str]:
        return [f"{launch.node_head(i)}: {shell_line(launch, i)}" for i in range(len(launch.nodes))]
