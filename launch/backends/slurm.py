"""--backend slurm: an sbatch script rendered from data (every value quoted once, as data_prep's Slurm executor does),
one torchrun per node under `srun --kill-on-bad-exit=1`.

Nodes: Slurm picks them (`#SBATCH --nodes=N`, no node list unless --nodelist / --pin-nodes asked for one), at every
start of the script, a requeue included; the script learns them from SLURM_JOB_NODELIST (`scontrol show
hostnames`): the master is the first, rank_exec.sh names hosts from that list. Partition, account, time, QOS and
--exclusive become `#SBATCH` lines; a container (--container-image, pyxis) goes on the srun line, as pyxis documents
it: `srun --container-image=IMG --container-mounts=SRC:DST --container-workdir=DIR ...`; the script's own
bookkeeping (scontrol, the failure report) runs outside it, with the launcher's Python.

Requeue: `scontrol requeue` (or a node failure) restarts the script; training resumes from the newest complete
checkpoint. LAUNCH_SLURM_GRACE s before the time limit Slurm sends USR1 to the script, which stops the ranks (SIGTERM:
they save a checkpoint and exit 0) and requeues the job. A stop (launch/stop.sh) signals the job's steps itself and
leaves RUN_DIR/stop_requested, so the script ends the job instead of reporting a failure. Each start of the script
has its own exit-record directory (LOG_DIR/slurm-<job>.<restart>/exits): the failure named is this attempt's."""
from __future__ import annotations

import shlex
import shutil
import subprocess

from launch.backends.base import Backend, Launch, quote_words
from launch.common import LaunchError
from launch.slurm_request import SlurmRequest

_Q = shlex.quote


def _request(launch: Launch) -> SlurmRequest:
    return launch.slurm or SlurmRequest()


def _header(launch: Launch) -> list[str]:
    slots = launch.nodes[0].slots
    req = _request(launch)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={launch.run_id}", f"#SBATCH --nodes={len(launch.nodes)}",
             "#SBATCH --ntasks-per-node=1", *req.sbatch_lines(),
             f'#SBATCH --output="{launch.log_dir}/slurm-%j.out"', "#SBATCH --open-mode=append"]
    if launch.device == "cuda":  # a CPU recipe asks for none: a cluster without GRES gpu refuses such a job outright
        lines.append(f"#SBATCH --gpus-per-node={slots}")
    where = f"only on {req.nodelist}" if req.nodelist else "chosen by Slurm at every start (a requeue included)"
    return lines + ["#SBATCH --requeue", f"#SBATCH --signal=B:USR1@{launch.slurm_grace_s}",
                    f"# world size {launch.plan.world_size} = {len(launch.nodes)} nodes x {slots} ranks; "
                    f"{launch.layout}; device {launch.device}", f"# nodes: {where}",
                    "# Written by launch/train.sh --backend slurm (launch/backends/slurm.py): requeue-safe; "
                    "launch/stop.sh RUN_DIR stops it."]


def _master(launch: Launch) -> list[str]:
    """MASTER_ADDR: --master-addr, else the job's first node as Slurm reaches it (its NodeAddr; its name when the
    cluster configures no address): node names need not resolve (NodeName=gpu001 NodeAddr=10.1.0.1)."""
    if launch.master_addr_opt:
        return [f"export MASTER_ADDR=${{MASTER_ADDR:-{_Q(launch.master_addr_opt)}}}"]
    return ['first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
            "first_addr=$(scontrol -o show node \"$first_node\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')",
            "export MASTER_ADDR=${MASTER_ADDR:-${first_addr:-$first_node}}"]


def _environment(launch: Launch) -> list[str]:
    attempt = _Q(str(launch.log_dir)) + '/slurm-"$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"'
    return [f"export {k}={_Q(v)}" for k, v in (line.split("=", 1) for line in launch.env_lines)] + _master(launch) + [
        f"export MASTER_PORT={launch.master_port}",
        'export LAUNCH_HOSTS="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr \'\\n\' \' \')"',
        f"export LAUNCH_EXIT_DIR={attempt}/exits",
        'mkdir -p "$LAUNCH_EXIT_DIR"']


def srun_options(launch: Launch) -> list[str]:
    """srun's options: every node stops when one fails; one log per node; pyxis's container options, if any."""
    container = _request(launch).container
    return ["--kill-on-bad-exit=1", "--wait=60", "--open-mode=append", f"--output={launch.log_dir}/%N.log",
            *(container.srun_options() if container else [])]


def _run(launch: Launch) -> list[str]:
    slots = launch.nodes[0].slots
    return [
        f"cd {_Q(launch.launcher_repo or launch.repo)}",
        'echo "[launch] job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $LAUNCH_HOSTS at $(date -u +%FT%TZ)"',
        "# The per-rank command as words, quoted once here; the bash -c text below contains none of them.",
        f"rank_cmd=({quote_words([launch.torchrun(), *launch.rank_cmd])})",
        "pre_empted=0",
        "# scancel without --batch/--full signals the steps only (not this script): the ranks get SIGTERM, save, exit 0.",
        'on_usr1() { pre_empted=1; echo "[launch] USR1: time limit near, stopping the ranks (they save) to requeue"; '
        'scancel --signal=TERM "$SLURM_JOB_ID"; }',
        "trap on_usr1 USR1",
        "# One torchrun per node; --kill-on-bad-exit stops every node when one fails. In the background: bash runs a",
        "# trap only between commands, and `wait` returns on a signal.",
        f"srun {quote_words(srun_options(launch))} \\",
        f"  bash -c 'exec \"$0\" --nnodes=$SLURM_NNODES --node_rank=$SLURM_NODEID --nproc_per_node={slots} "
        "--master_addr=$MASTER_ADDR --master_port=$MASTER_PORT --max_restarts=0 --no-python \"$@\"' "
        '"${rank_cmd[@]}" &',
        "srun_pid=$!",
        'wait "$srun_pid"; rc=$?',
        'while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid"; rc=$?; done']


def _ending(launch: Launch) -> list[str]:
    log = _Q(str(launch.log_dir))
    secret = next((line.split("=", 1)[1] for line in launch.env_lines if line.startswith("LAUNCH_ENV_FILE=")), "")
    # The 0600 env file: every rank reads it at start, a requeued job again; removed when the job ends for good.
    drop = f"rm -f {_Q(secret)}" if secret else ":"
    report = (f"{_Q(launch.launcher_python or launch.python)} -m launch report-failure \"$LAUNCH_EXIT_DIR\" {log} "
              f"{_Q(' the job ends (every rank was stopped).')}")
    return [
        'if [ "$pre_empted" = 1 ]; then',
        '  echo "[launch] requeueing job $SLURM_JOB_ID: it resumes from the newest complete checkpoint"',
        '  scontrol requeue "$SLURM_JOB_ID"', "  exit 0", "fi",
        f"if [ -e {log}/stop_requested ]; then",
        f'  {drop}; echo "[launch] job $SLURM_JOB_ID stopped on request (launch/stop.sh)"; exit 0', "fi",
        'if [ "$rc" -ne 0 ]; then', f"  {drop}",
        f'  {report} 2>&1 || echo "[launch] FAILED: srun exited with code $rc before any rank reported; see" {log}/',
        '  exit "$rc"', "fi",
        drop,
        "# srun can exit 0 although a node's task never started (seen with a SPANK plugin, pyxis, failing on the",
        "# node: 'task 0 launch failed: Plugin initialization failed'): success is every rank's exit record.",
        'records=$(find "$LAUNCH_EXIT_DIR" -maxdepth 1 -name "rank-*.exit" | wc -l)',
        f'if [ "$records" -ne {launch.plan.world_size} ]; then',
        f'  echo "[launch] FAILED: srun exited 0 but only $records of {launch.plan.world_size} ranks left an exit '
        'record: a node\'s task did not start (see srun\'s error above)"',
        "  exit 1", "fi",
        f'echo "[launch] job $SLURM_JOB_ID finished: all {launch.plan.world_size} ranks exited 0"']


def script(launch: Launch) -> str:
    return "\n".join(_header(launch) + ["set -uo pipefail"] + _environment(launch) + _run(launch) + _ending(launch)) \
        + "\n"


def pyxis_missing() -> str | None:
    """Why this machine's srun cannot run a container, or None: pyxis is a SPANK plugin, and srun lists
    --container-image in its help only when the plugin is loaded (plugstack.conf)."""
    srun = shutil.which("srun")
    if not srun:
        return "srun not found: this is not a Slurm login node"
    try:
        r = subprocess.run([srun, "--help"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`srun --help` did not answer ({e})"
    if "--container-image" in r.stdout + r.stderr:
        return None
    if r.returncode != 0:
        first = (r.stderr or r.stdout).strip().splitlines()[:1]
        return f"`srun --help` failed ({first[0] if first else f'exit {r.returncode}'}), so pyxis cannot be seen"
    return ("`srun --help` lists no --container-image: the pyxis SPANK plugin is not installed (or not in "
            "plugstack.conf) here")


class Slurm(Backend):
    name = "slurm"

    def check(self, launch: Launch, starting: bool) -> None:
        if starting and _request(launch).container:
            why = pyxis_missing()
            if why:
                raise LaunchError(f"--container-image needs pyxis and enroot on the cluster: {why}. Ask its "
                                  "administrators for pyxis (https://github.com/NVIDIA/pyxis), or run without "
                                  "--container-image (the repository and its .venv on a shared file system); nothing "
                                  "was submitted", 2)

    def plan_lines(self, launch: Launch) -> list[str]:
        out = []
        for i, n in enumerate(launch.nodes):
            first, last = launch.plan.rank_range(i)
            host = "(chosen by Slurm)" if launch.plan.slurm_picks else n.host
            out.append(f"node {i} {host} slots={n.slots} ranks={first}-{last}")
        container = _request(launch).container
        if container:
            why = pyxis_missing()
            out.append(f"container: {' '.join(container.srun_options())} (ranks run {launch.repo}/.venv; "
                       + ("pyxis found: srun --help lists --container-image)" if why is None else
                          f"submitting is refused here: {why})"))
        return out

    def files(self, launch: Launch) -> dict[str, str]:
        return {"job.sbatch": script(launch)}

    def spawns(self, launch: Launch):
        return []  # submitted with sbatch (launch/train.py), not started here
