"""--backend slurm: an sbatch script rendered from data (every value quoted once, as data_prep's Slurm executor does),
one torchrun per node under `srun --kill-on-bad-exit=1`.

Requeue: `scontrol requeue` (or a node failure) restarts the script; training resumes from the newest complete
checkpoint. LAUNCH_SLURM_GRACE s before the time limit Slurm sends USR1 to the script, which stops the ranks (SIGTERM:
they save a checkpoint and exit 0) and requeues the job. A stop (launch/stop.sh) signals the job's steps itself and
leaves RUN_DIR/stop_requested, so the script ends the job instead of reporting a failure. Each start of the script
has its own exit-record directory (LOG_DIR/slurm-<job>.<restart>/exits): the failure named is this attempt's."""
from __future__ import annotations

import shlex

from launch.backends.base import Backend, Launch, quote_words

_Q = shlex.quote


def _header(launch: Launch) -> list[str]:
    slots = launch.nodes[0].slots
    lines = ["#!/bin/bash", f"#SBATCH --job-name={launch.run_id}", f"#SBATCH --nodes={len(launch.nodes)}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --nodelist={','.join(n.host for n in launch.nodes)}",
             f'#SBATCH --output="{launch.log_dir}/slurm-%j.out"', "#SBATCH --open-mode=append"]
    if launch.device == "cuda":  # a CPU recipe asks for none: a cluster without GRES gpu refuses such a job outright
        lines.append(f"#SBATCH --gpus-per-node={slots}")
    return lines + ["#SBATCH --requeue", f"#SBATCH --signal=B:USR1@{launch.slurm_grace_s}",
                    f"# world size {launch.plan.world_size} = {len(launch.nodes)} nodes x {slots} ranks; "
                    f"{launch.layout}; device {launch.device}",
                    "# Written by launch/train.sh --backend slurm (launch/backends/slurm.py): requeue-safe; "
                    "launch/stop.sh RUN_DIR stops it."]


def _environment(launch: Launch) -> list[str]:
    addr = _Q(launch.master_addr_opt) if launch.master_addr_opt else \
        '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)'
    attempt = _Q(str(launch.log_dir)) + '/slurm-"$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"'
    return [f"export {k}={_Q(v)}" for k, v in (line.split("=", 1) for line in launch.env_lines)] + [
        f"export MASTER_ADDR=${{MASTER_ADDR:-{addr}}}",
        f"export MASTER_PORT={launch.master_port}",
        'export LAUNCH_HOSTS="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr \'\\n\' \' \')"',
        f"export LAUNCH_EXIT_DIR={attempt}/exits",
        'mkdir -p "$LAUNCH_EXIT_DIR"']


def _run(launch: Launch) -> list[str]:
    slots = launch.nodes[0].slots
    return [
        f"cd {_Q(launch.repo)}",
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
        f"srun --kill-on-bad-exit=1 --wait=60 --open-mode=append --output={_Q(str(launch.log_dir))}/%N.log \\",
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
    report = (f"{_Q(launch.python)} -m launch report-failure \"$LAUNCH_EXIT_DIR\" {log} "
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
        f'echo "[launch] job $SLURM_JOB_ID finished: all {launch.plan.world_size} ranks exited 0"']


def script(launch: Launch) -> str:
    return "\n".join(_header(launch) + ["set -uo pipefail"] + _environment(launch) + _run(launch) + _ending(launch)) \
        + "\n"


class Slurm(Backend):
    name = "slurm"

    def files(self, launch: Launch) -> dict[str, str]:
        return {"job.sbatch": script(launch)}

    def spawns(self, launch: Launch):
        return []  # submitted with sbatch (launch/train.py), not started here
