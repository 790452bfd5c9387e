"""--dry-run on a 100-node hostfile: world size, the rank range and node rank of every node, the master address;
and the generated Slurm script. Nothing is started (no ssh, no processes)."""
import base64
import json
import re

import pytest

from tests.support.launch import DATA, REPO, TOY, launch_env, run_launch

N, SLOTS = 100, 8


def hostfile_100(tmp_path):
    p = tmp_path / "hostfile"
    p.write_text("# a big cluster\n" + "".join(f"gpu{i:03d} slots={SLOTS}\n" for i in range(1, N + 1)))
    return p


def node_lines(out):
    return [re.match(r"node (\d+) (\S+) slots=(\d+) ranks=(\d+)-(\d+)(?:: (.*))?$", l) for l in out.splitlines()
            if l.startswith("node ")]


@pytest.mark.multiproc  # the launcher end to end (~5 s): not the fast tier
def test_dry_run_100_nodes_torchrun_and_deepspeed(tmp_path):
    hf = hostfile_100(tmp_path)
    for backend in ("torchrun-ssh", "deepspeed"):
        r = run_launch("train.sh", TOY, "--hostfile", hf, "--backend", backend, "--dry-run", "--master-port", 23456,
                       "--log-dir", tmp_path / backend, "--", "parallel.tp=8", "parallel.pp=2", "training.global_batch=400",
                       "model.num_attention_heads=8", "model.num_query_groups=8")
        assert r.returncode == 0, r.stderr
        assert f"backend={backend} nodes={N} world_size={N * SLOTS} master=gpu001:23456" in r.stdout
        assert "TP=8 x PP=2 x DP=50" in r.stdout
        lines = node_lines(r.stdout)
        assert len(lines) == N and all(lines)
        next_rank = 0
        for i, m in enumerate(lines):
            assert int(m[1]) == i and m[2] == f"gpu{i + 1:03d}" and int(m[3]) == SLOTS
            assert (int(m[4]), int(m[5])) == (next_rank, next_rank + SLOTS - 1)
            next_rank += SLOTS
            cmd = m[6]
            assert f"--node_rank={i} " in cmd and "--master_addr=gpu001 " in cmd and "--master_port=23456" in cmd
            assert "recipes train --config" in cmd and "parallel.tp=8" in cmd
            if backend == "torchrun-ssh":
                assert f"--nnodes={N} " in cmd and f"--nproc_per_node={SLOTS} " in cmd and f"LAUNCH_HOST=gpu{i + 1:03d}" in cmd
            else:  # DeepSpeed's world_info: every host with its slot indices, in hostfile order
                info = json.loads(base64.urlsafe_b64decode(re.search(r"--world_info=(\S+)", cmd)[1]))
                assert list(info) == [f"gpu{j:03d}" for j in range(1, N + 1)] and info["gpu050"] == list(range(SLOTS))
        assert next_rank == N * SLOTS
        assert not (tmp_path / backend / "hosts").exists()  # a dry run records no started run


@pytest.mark.unit
def test_dry_run_selection_and_master_override(tmp_path):
    hf = hostfile_100(tmp_path)
    r = run_launch("train.sh", TOY, "--hostfile", hf, "--backend", "torchrun-ssh", "--dry-run", "--exclude",
                   "gpu001@gpu002", "--num-nodes", 3, "--num-gpus", 4, "--master-addr", "10.0.0.7",
                   "--log-dir", tmp_path / "d", "--", "training.global_batch=12")
    assert r.returncode == 0, r.stderr
    port = int(re.search(r"nodes=3 world_size=12 master=10\.0\.0\.7:(\d+) ", r.stdout)[1])
    assert 20000 <= port < 32016  # derived from the run id (no fixed default that two runs would share), not ephemeral
    assert [m[2] for m in node_lines(r.stdout)] == ["gpu003", "gpu004", "gpu005"]


@pytest.mark.multiproc  # the launcher end to end (~5 s): not the fast tier
def test_slurm_script(tmp_path):
    hf = hostfile_100(tmp_path)
    r = run_launch("train.sh", TOY, "--hostfile", hf, "--backend", "slurm", "--dry-run", "--master-port", 29999,
                   "--pin-nodes", "--log-dir", tmp_path / "s", "--", "parallel.tp=4", "training.global_batch=200", "model.num_query_groups=4",
                   "cluster.device=cuda")
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "s" / "job.sbatch").read_text()
    assert script in r.stdout
    assert f"#SBATCH --nodes={N}\n" in script and "#SBATCH --ntasks-per-node=1\n" in script
    assert f"#SBATCH --gpus-per-node={SLOTS}\n" in script
    assert "#SBATCH --nodelist=gpu001,gpu002," in script and ",gpu100\n" in script
    assert f"world size {N * SLOTS} = {N} nodes x {SLOTS} ranks; TP=4 x PP=1 x DP=200" in script
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in script  # master = first node of the job
    srun = script[script.index("srun "):]
    assert "--kill-on-bad-exit=1" in srun and "--node_rank=$SLURM_NODEID" in srun and "--nnodes=$SLURM_NNODES" in srun
    assert f"--nproc_per_node={SLOTS}" in srun and "--master_port=$MASTER_PORT" in srun and "MASTER_PORT=29999" in script
    rank_cmd = script[script.index("rank_cmd=("):]  # the words, quoted once; srun's bash -c text holds none
    assert "recipes train --config" in rank_cmd and "parallel.tp=4" in rank_cmd and '"${rank_cmd[@]}"' in srun
    r = run_launch("train.sh", TOY, "--hostfile", hf, "--backend", "slurm", "--dry-run", "--num-nodes", 2,
                   "--master-addr", "head-node", "--log-dir", tmp_path / "s2", "--", "training.global_batch=16")
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "s2" / "job.sbatch").read_text()
    assert "export MASTER_ADDR=${MASTER_ADDR:-head-node}" in script
    assert "#SBATCH --nodes=2\n" in r.stdout
    # the toy recipe runs on cpu: no GPUs requested (a cluster without GRES gpu refuses such a job outright)
    assert "--gpus-per-node" not in script and "; device cpu\n" in script
    assert "#SBATCH --requeue\n" in script and "#SBATCH --signal=B:USR1@300\n" in script


@pytest.mark.multiproc  # the launcher end to end (~5 s): not the fast tier
def test_dry_run_real_100_node_recipe_and_environment(tmp_path):
    """The shipped GLM-130B recipe (TP=4 x PP=5, 100 x 8 GPUs) resolves to DP=40; NCCL_*/GLOO_* settings reach every
    node's command (torchrun over ssh) or the DeepSpeed env file; --env variables are named, their values are not
    printed (they travel in a 0600 file, see test_secrets.py)."""
    hf = hostfile_100(tmp_path)
    recipe = REPO / "configs" / "runs" / "glm-130b-100x8-a100.yaml"
    env = launch_env(forked=False, NCCL_IB_HCA="mlx5_0,mlx5_1", GLOO_SOCKET_IFNAME="ib0", MY_SETTING="a b")
    r = run_launch("train.sh", recipe, "--hostfile", hf, "--backend", "torchrun-ssh", "--dry-run", "--env",
                   "MY_SETTING", "--log-dir", tmp_path / "t", "--", DATA, env=env)
    assert r.returncode == 0, r.stderr
    assert "world_size=800" in r.stdout and "TP=4 x PP=5 x DP=40" in r.stdout
    for m in node_lines(r.stdout):
        assert "NCCL_IB_HCA=mlx5_0\\,mlx5_1 " in m[6] or "NCCL_IB_HCA=mlx5_0,mlx5_1 " in m[6], m[6][:400]
        assert "GLOO_SOCKET_IFNAME=ib0 " in m[6] and "OMP_NUM_THREADS=1 " in m[6] and "MY_SETTING=" not in m[6]
        assert "LAUNCH_ENV_NAMES=MY_SETTING " in m[6]  # its name only: what rank_exec.sh may export from the file
    assert "user env (values not shown): MY_SETTING" in r.stdout and "a b" not in r.stdout
    r = run_launch("train.sh", recipe, "--hostfile", hf, "--backend", "deepspeed", "--dry-run", "--env",
                   "MY_SETTING", "--log-dir", tmp_path / "d", "--", DATA, env=env)
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "d" / "launch.env").read_text().splitlines()
    for want in ("NCCL_IB_HCA=mlx5_0,mlx5_1", "GLOO_SOCKET_IFNAME=ib0",
                 f"VIRTUAL_ENV={REPO / '.venv'}", f"LAUNCH_ENV_FILE={tmp_path / 'd' / 'secret.env'}"):
        assert want in lines
    assert not any(l.startswith("MY_SETTING") for l in lines)
    assert f"DS_ENV_FILE={tmp_path / 'd' / 'ds.env'} " in r.stdout
    # 7 nodes x 8 = 56 ranks does not fit TP x PP = 20: refused with the fix, nothing started
    r = run_launch("train.sh", recipe, "--hostfile", hf, "--num-nodes", 7, "--dry-run", "--log-dir", tmp_path / "x")
    assert r.returncode == 3 and "multiple of tp x pp = 20" in r.stderr and not (tmp_path / "x").exists()
