"""--backend deepspeed: DeepSpeed's runner over pdsh (`python -m deepspeed.launcher.runner --launcher pdsh`), which
starts `deepspeed.launcher.launch` on every node with the settings of its env file (DS_ENV_FILE).

Its pdsh runner pastes `cd <cwd>; <python> -u -m ...` and `export NAME=<value>` lines into one remote shell line, and
the program's arguments too ("a b" in double quotes, the rest bare): so the repository and venv paths must be plain
(refused otherwise, with the fix), the env file's values are escaped for its double quotes, and the per-rank command
travels as shell-quoted words in LAUNCH_RANK_CMD, which rank_exec.sh (the only argument DeepSpeed sees) runs."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil

from launch.backends.base import Backend, Launch, Spawn, quote_words
from launch.common import LaunchError


def _dq_escape(value: str) -> str:
    """The runner writes `export NAME="VALUE"` when VALUE has a character outside [\\w@%+=:,./-], else
    `export NAME=VALUE`: escaping \\ " $ ` gives the literal value in the first case and changes nothing in the second
    (a value holding one of them is always quoted)."""
    for ch in ("\\", '"', "$", "`"):
        value = value.replace(ch, "\\" + ch)
    return value


def world_info(launch: Launch) -> str:
    info = {n.host: list(n.devices) for n in launch.nodes}
    return base64.urlsafe_b64encode(json.dumps(info).encode()).decode()


class DeepSpeed(Backend):
    name = "deepspeed"

    def check(self, launch: Launch, starting: bool) -> None:
        for p in (launch.repo, launch.python):
            if not re.fullmatch(r"[A-Za-z0-9/._+-]+", p):
                raise LaunchError(f"--backend deepspeed cannot run from '{p}': DeepSpeed's runner puts this path "
                                  "unquoted into a shell command; use a path of letters, digits and /._+- only, or "
                                  "--backend torchrun-ssh", 2)
        if starting and not shutil.which("pdsh"):
            raise LaunchError("--backend deepspeed runs DeepSpeed's runner over pdsh, which is not installed: run "
                              "launch/install_system_deps.sh (apt-get install pdsh), or use --backend torchrun-ssh", 2)

    def env_extra(self, launch: Launch) -> list[str]:
        # One environment for all nodes: each rank finds its host's name by node index in LAUNCH_HOSTS.
        return [f"LAUNCH_HOSTS={' '.join(n.host for n in launch.nodes)}",
                f"LAUNCH_RANK_CMD={quote_words(launch.rank_cmd[1:])}"]

    def files(self, launch: Launch) -> dict[str, str]:
        """ds.env (our settings only: the user's variables are in the 0600 file) and the resolved hostfile (only the
        selected hosts, so DeepSpeed sees exactly the plan printed)."""
        lines = launch.env_lines + self.env_extra(launch) + launch.attempt_env()
        env = "".join(f"{k}={_dq_escape(v)}\n" for k, v in (line.split("=", 1) for line in lines))
        return {"ds.env": env, "hostfile": "".join(f"{n.host} slots={n.slots}\n" for n in launch.nodes)}

    def runner(self, launch: Launch) -> list[str]:
        include = "@".join(f"{n.host}:{','.join(map(str, n.devices))}" for n in launch.nodes)
        return [launch.python, "-u", "-m", "deepspeed.launcher.runner", "--hostfile", str(launch.log_dir / "hostfile"),
                "--include", include, "--launcher", "pdsh", "--force_multi", "--master_addr", launch.plan.master_addr,
                "--master_port", str(launch.master_port), "--no_python", "--no_local_rank", launch.rank_cmd[0]]

    def spawns(self, launch: Launch) -> list[Spawn]:
        # The runner gets none of the user's variables: it would paste MLFLOW_* (and any it is given) as `export X=...`
        # into the pdsh command line and its log. In its own session: on SIGINT/SIGTERM it runs
        # `pkill -f "<python> -u -m deepspeed.launcher.launch"` on every node, which would kill every DeepSpeed run
        # from this venv there, other people's included; this run is stopped by run id instead. So the runner does not
        # carry the run id (the ranks get it from ds.env): a stop by run id on the launcher's node would otherwise
        # TERM it (seen under load: it outlived the launcher's kill by a moment, ran its pkill, and another run of
        # this venv lost every rank). It ends when its pdsh does, or by the launcher's SIGKILL.
        env = {k: v for k, v in os.environ.items() if k not in launch.secret_names and k != "LAUNCH_RUN_ID"}
        env.update(self.ssh.tool_env(), DS_ENV_FILE=str(launch.log_dir / "ds.env"))
        return [Spawn("deepspeed-runner", self.runner(launch), env=env, cwd=launch.repo, own_session=True,
                      demux_hosts=tuple(n.host for n in launch.nodes))]

    def plan_lines(self, launch: Launch) -> list[str]:
        out = []
        for i in range(len(launch.nodes)):  # what the pdsh runner starts on node i (it substitutes %n)
            out.append(f"{launch.node_head(i)}: export <each line of {launch.log_dir}/ds.env>; cd {launch.repo}; "
                       f"{launch.python} -u -m deepspeed.launcher.launch --world_info={world_info(launch)} "
                       f"--node_rank={i} --master_addr={launch.plan.master_addr} --master_port={launch.master_port} "
                       f"--no_python --no_local_rank {launch.rank_cmd[0]} (runs $LAUNCH_RANK_CMD: "
                       f"{quote_words(launch.rank_cmd[1:])})")
        out.append(f"runner: DS_ENV_FILE={launch.log_dir}/ds.env {quote_words(self.runner(launch))}")
        return out
