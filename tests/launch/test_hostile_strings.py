"""Hostile strings reach the ranks as text and run nothing: a venv and a log dir with spaces, the override
`name=it's $(touch X)` and a rank printing `...$(touch X): `, on every back end (Slurm: `bash -n job.sbatch`, then
the script itself run with stand-ins for srun and scontrol). The rank's recipe holds the literal name; X is never
created. The DeepSpeed runner pastes paths unquoted into its remote command, so a venv with spaces is refused there
with the fix."""
import json
import subprocess

import pytest

from tests.support import rank_forks
from tests.support.launch import REPO, TOY, TOY_ENTRY, free_port, launch_env, run_launch

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(240)]


@pytest.fixture
def hostile(tmp_path):
    venv = tmp_path / "my venv"  # the launcher tests' venv (its python and torchrun fork from a pre-imported template)
    venv.symlink_to(rank_forks.venv())
    marker = tmp_path / "pwned"
    return {"venv": venv, "logs": tmp_path / "run logs", "marker": marker, "out": tmp_path / "out.json",
            "name": f"it's $(touch {marker})"}


def _check(h, r):
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert not h["marker"].exists(), "a hostile string ran as a command"
    assert json.loads(h["out"].read_text())["name"] == h["name"]  # the rank's recipe holds the literal text
    logs = "".join(p.read_text() for p in h["logs"].glob("*.log"))
    assert f"{h['name']}: " in logs


@pytest.mark.parametrize("backend", ["local", "torchrun-ssh", "deepspeed"])
def test_real_runs(ssh_cluster, hostile, backend):
    config, hostfile = ssh_cluster
    where = ["--num-gpus", 2] if backend == "local" else ["--hostfile", hostfile]
    venv = {} if backend == "deepspeed" else {"LAUNCH_VENV": hostile["venv"]}
    r = run_launch("train.sh", TOY, *where, "--backend", backend, "--entry", TOY_ENTRY, "--env", "TOY_OUT",
                   "--master-port", free_port(), "--log-dir", hostile["logs"], "--quiet", "--",
                   f"name={hostile['name']}", env=launch_env(LAUNCH_SSH_CONFIG=config, TOY_OUT=hostile["out"], **venv),
                   timeout=200)
    _check(hostile, r)


def test_deepspeed_refuses_a_venv_with_spaces(ssh_cluster, hostile):
    config, hostfile = ssh_cluster
    r = run_launch("train.sh", TOY, "--hostfile", hostfile, "--backend", "deepspeed", "--dry-run", "--log-dir",
                   hostile["logs"], env=launch_env(LAUNCH_SSH_CONFIG=config, LAUNCH_VENV=hostile["venv"]))
    assert r.returncode == 2 and "--backend torchrun-ssh" in r.stderr and "my venv" in r.stderr


def test_slurm_script(hostile, tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("node1 slots=2\n")
    env = launch_env(LAUNCH_VENV=hostile["venv"], TOY_OUT=hostile["out"])
    r = run_launch("train.sh", TOY, "--hostfile", hf, "--backend", "slurm", "--entry", TOY_ENTRY, "--env", "TOY_OUT",
                   "--master-port", free_port(), "--log-dir", hostile["logs"], "--dry-run", "--",
                   f"name={hostile['name']}", env=env)
    assert r.returncode == 0, r.stderr
    script = hostile["logs"] / "job.sbatch"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    # Run the job script as Slurm would on its one node: srun runs its command once with the task's variables.
    # The script sets PATH to the venv's bin first: the stand-ins go there, in a venv made of links to the real one
    # (python and torchrun: the launcher tests' forking ones).
    real = (REPO / ".venv").resolve()
    hostile["venv"].unlink()
    fake = hostile["venv"] / "bin"
    fake.mkdir(parents=True)
    (hostile["venv"] / "lib").symlink_to(real / "lib")
    (hostile["venv"] / "pyvenv.cfg").symlink_to(real / "pyvenv.cfg")
    for f in (rank_forks.venv() / "bin").iterdir():
        (fake / f.name).symlink_to(f)
    (fake / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\n")
    (fake / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\n'
                               'SLURM_NNODES=1 SLURM_NODEID=0 exec "$@"\n')
    for f in ("scontrol", "srun"):
        (fake / f).chmod(0o755)
    # the secret env file is written when the job is submitted (not by a dry run); make it as sbatch's launcher would
    secret = hostile["logs"] / "secret.env"
    secret.write_text(f"TOY_OUT={hostile['out']}\n")
    secret.chmod(0o600)
    job_env = dict(env, SLURM_JOB_NODELIST="node1", SLURM_JOB_ID="1")
    job = subprocess.run(["bash", str(script)], cwd=tmp_path, env=job_env, capture_output=True, text=True, timeout=200)
    assert job.returncode == 0, (job.stdout + job.stderr)[-4000:]
    assert not hostile["marker"].exists(), "a hostile string ran as a command"
    assert json.loads(hostile["out"].read_text())["name"] == hostile["name"]
    assert not secret.exists()  # the job removes the env file when it ends


def test_bad_env_names_values_and_hosts_refused(tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("node1 slots=2\n")
    marker = tmp_path / "pwned"
    common = [TOY, "--hostfile", hf, "--backend", "torchrun-ssh", "--dry-run", "--log-dir", tmp_path / "l"]
    r = run_launch("train.sh", *common, "--env", f"x[$(touch {marker})]", env=launch_env())
    assert r.returncode == 2 and "is not a variable name" in r.stderr and not marker.exists()
    r = run_launch("train.sh", *common, "--env", "TWO_LINES", env=launch_env(TWO_LINES="a\nb=c"))
    assert r.returncode == 2 and "TWO_LINES: the value spans several lines" in r.stderr
    hf.write_text("-oBatchMode slots=2\n")  # ssh would read it as an option
    r = run_launch("train.sh", *common, env=launch_env())
    assert r.returncode == 2 and "starts with '-'" in r.stderr
