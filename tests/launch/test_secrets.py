"""Secrets stay secret: sentinel values in WANDB_API_KEY, HF_TOKEN and AWS_SECRET_ACCESS_KEY (passed with --env) are
in no output, in no file under the log dir except the 0600 env file, on no process's command line during a real
two-node run (what every user of a node sees with ps), and still in every rank's environment."""
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.launch import REPO, TOY, TOY_ENTRY, free_port, launch_env, run_launch


SECRETS = {"WANDB_API_KEY": "wandb-SENTINEL-1f3a9", "HF_TOKEN": "hf_SENTINEL-9c2b7", "AWS_SECRET_ACCESS_KEY": "aws/SENTINEL+77d0"}
ENV_FLAG = ["--env", "AWS_SECRET_ACCESS_KEY,WANDB_API_KEY,HF_TOKEN"]


def _leaks(text: str) -> list[str]:
    return [v for v in SECRETS.values() if v in text]


def _files_with_secrets(log_dir: Path) -> list[str]:
    out = []
    for p in log_dir.rglob("*"):
        if p.is_file() and _leaks(p.read_text(errors="replace")):
            mode = stat.S_IMODE(p.stat().st_mode)
            if not (p.name == "secret.env" and mode == 0o600):
                out.append(f"{p} (mode {mode:o})")
    return out


@pytest.mark.ssh
@pytest.mark.parametrize("backend", ["torchrun-ssh", "deepspeed", "slurm", "local"])
def test_dry_run_prints_names_not_values(tmp_path, backend):
    hf = tmp_path / "hostfile"
    hf.write_text("gpu001 slots=2\ngpu002 slots=2\n")
    where = ["--num-gpus", 4] if backend == "local" else ["--hostfile", hf]
    logs = tmp_path / "logs"
    r = run_launch("train.sh", TOY, *where, "--backend", backend, "--dry-run", *ENV_FLAG, "--log-dir", logs,
                   "--", "training.global_batch=8", env=launch_env(**SECRETS))
    assert r.returncode == 0, r.stderr
    assert not _leaks(r.stdout + r.stderr), r.stdout
    assert not _files_with_secrets(logs)
    for name in SECRETS:
        assert name in r.stdout  # named, so the user sees what is propagated


def _scan_cmdlines() -> list[str]:
    hits = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if _leaks(cmd):
                hits.append(f"{p.name}: {cmd[:300]}")
    return hits


def _rank_environs(run_id: str) -> dict[int, list[bytes]]:
    """RANK -> environment of each training process (the entry, not its wrappers) of the run."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"LAUNCH_RUN_ID={run_id}".encode() in env and any(c.endswith(b"toy_train.py") for c in cmd) \
                and cmd[0].endswith(b"python"):
            rank = [e for e in env if e.startswith(b"RANK=")]
            if rank:
                out[int(rank[0][5:])] = env
    return out


@pytest.mark.ssh
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["torchrun-ssh", "deepspeed"])
def test_two_node_run_keeps_secrets(ssh_cluster, tmp_path, backend):
    config, hostfile = ssh_cluster
    logs, run_id = tmp_path / "logs", f"secret-{backend}"
    env = launch_env(LAUNCH_SSH_CONFIG=config, TOY_STEP_SLEEP="0.3", **SECRETS)
    proc = subprocess.Popen(
        ["bash", str(REPO / "launch" / "train.sh"), str(TOY), "--hostfile", str(hostfile), "--backend", backend,
         "--entry", TOY_ENTRY, *ENV_FLAG, "--env", "TOY_STEP_SLEEP", "--run-id", run_id,
         "--master-port", str(free_port()), "--log-dir", str(logs), "--", "training.train_steps=20"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    on_cmdlines, environs, env_file_mode = [], {}, None
    deadline = time.time() + 180
    while proc.poll() is None and time.time() < deadline:
        on_cmdlines += _scan_cmdlines()
        if len(environs) < 4:
            environs.update(_rank_environs(run_id))
        if env_file_mode is None and (logs / "secret.env").exists():
            env_file_mode = stat.S_IMODE((logs / "secret.env").stat().st_mode)
        time.sleep(0.1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert not on_cmdlines, on_cmdlines[:3]
    assert not _leaks(out + err)
    assert not _files_with_secrets(logs)
    assert env_file_mode == 0o600
    assert sorted(environs) == [0, 1, 2, 3], f"saw ranks {sorted(environs)}"
    for rank, e in environs.items():
        for name, value in SECRETS.items():
            assert f"{name}={value}".encode() in e, f"rank {rank} lacks {name}"
    assert "step 19 loss" in (logs / "node2.log").read_text()


@pytest.mark.unit
def test_variable_names_that_are_not_names_never_reach_an_export_line(tmp_path):
    """Round 4: a variable's *name* may hold any byte but '=' (`HF_X;touch /tmp/p`); matched by its prefix alone, it
    reached job.sbatch's `export` lines and DeepSpeed's pdsh export line unquoted. Now only whole variable names are
    propagated (and the dry run's job script holds none of the others)."""
    from launch import environment

    env = {"HF_TOKEN": "x", "HF_X;touch PWNED": "y", "NCCL_DEBUG": "INFO", "NCCL_$(id)": "z"}
    assert environment.secret_names([], env) == ["HF_TOKEN"]
    assert environment.plumbing_names(env) == ["NCCL_DEBUG"]
    e = dict(launch_env(), **{"HF_X;touch PWNED": "y"})
    r = run_launch("train.sh", TOY, "--backend", "slurm", "--nodes", 1, "--dry-run", "--log-dir",
                   tmp_path / "d", env=e)
    assert r.returncode == 0, r.stderr
    assert "PWNED" not in r.stdout and "PWNED" not in (tmp_path / "d" / "job.sbatch").read_text()
