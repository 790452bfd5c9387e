"""`--backend slurm` the Slurm way, without a job: no hostfile (`--nodes`, `--gpus-per-node`), sbatch's own
partition/account/time/qos/--exclusive, no node list unless asked, pyxis container flags on the srun line; every bad
value refused with the flag named (exit 2, no log dir). The scripts are checked with `bash -n`; the real Slurm runs
them in test_slurm.py."""
import re
import subprocess

import pytest

from launch.common import LaunchError
from launch.options import parse
from launch.slurm_request import time_seconds
from tests.support.launch import REPO, TOY, run_launch

pytestmark = pytest.mark.unit

GPU = ["--", "cluster.device=cuda", "training.global_batch=64"]  # the toy on GPUs: the script asks for them


@pytest.fixture
def script_of(launch_here):
    return lambda *a, **k: _script_of(launch_here, *a, **k)


def _script_of(launch_here, tmp_path, *args, name="s"):
    r = launch_here("train.sh", TOY, "--backend", "slurm", "--dry-run", "--master-port", 29999, "--log-dir",
                   tmp_path / name, *args)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / name / "job.sbatch").read_text()
    assert text in r.stdout
    check = subprocess.run(["bash", "-n", str(tmp_path / name / "job.sbatch")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    return r.stdout, text


def sbatch_lines(script):
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def test_no_hostfile_slurm_picks_the_nodes(tmp_path, script_of):
    out, script = script_of(tmp_path, "--nodes", 4, "--partition", "gpu", "--account", "proj-1", "--time",
                            "2-00:00:00", "--qos", "high", "--exclusive", *GPU)
    run_id = re.search(r"run_id=(\S+)", out)[1]
    assert sbatch_lines(script) == [
        f"#SBATCH --job-name={run_id}", "#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=gpu", "#SBATCH --account=proj-1", "#SBATCH --time=2-00:00:00", "#SBATCH --qos=high",
        "#SBATCH --exclusive", f'#SBATCH --output="{tmp_path / "s"}/slurm-%j.out"', "#SBATCH --open-mode=append",
        "#SBATCH --gpus-per-node=8",  # the recipe's cluster.gpus_per_node (clusters/cpu-local: 8)
        "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300"]
    assert "world_size=32" in out and "TP=1 x PP=1 x DP=32" in out
    assert [f"node {i} (chosen by Slurm) slots=8 ranks={8 * i}-{8 * i + 7}" for i in range(4)] == \
        [line for line in out.splitlines() if line.startswith("node ")]
    # the job learns its nodes when it starts: the master and the host names come from SLURM_JOB_NODELIST
    assert ('first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\n'
            "first_addr=$(scontrol -o show node \"$first_node\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')\n"
            "export MASTER_ADDR=${MASTER_ADDR:-${first_addr:-$first_node}}\n") in script
    assert 'LAUNCH_HOSTS="$(scontrol show hostnames "$SLURM_JOB_NODELIST"' in script
    assert "# nodes: chosen by Slurm at every start (a requeue included)" in script
    # the recipe's world is 1 x 8: the plan says how DP and the micro-batches per step change (64 x 64 tokens)
    assert ("world: 32 ranks (--nodes 4 x --gpus-per-node 8), not the recipe's cluster.nodes x gpus_per_node = 1 x 8 "
            "= 8: DP 8 -> 32; micro-batches per step on each DP rank 8 -> 2 (global batch 64 = micro-batch 1 x DP x "
            "micro-batches); tokens per step stay 4,096 (global batch x seq_length), per DP rank 512 -> 128\n") in out
    _, script = script_of(tmp_path, "--nodes", 2, "--gpus-per-node", 4, "--nodelist", "gpu[001-004]", "--",
                          "cluster.device=cuda", name="s2")
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=4" in script
    assert "#SBATCH --nodelist=gpu[001-004]" in script and "# nodes: only on gpu[001-004]" in script
    _, script = script_of(tmp_path, "--nodes", 1, "--gpus-per-node", 2, "--exclude", "gpu[005-006],gpu9",
                          name="s3")
    assert "#SBATCH --exclude=gpu[005-006],gpu9" in script and "--nodelist" not in script


def test_hostfile_form_pins_no_node_unless_asked(tmp_path, script_of):
    hf = tmp_path / "hostfile"
    hf.write_text("gpu001 slots=4\ngpu002 slots=4\ngpu003 slots=4\n")
    _, script = script_of(tmp_path, "--hostfile", hf, "--num-nodes", 2)
    assert "#SBATCH --nodes=2" in script and "--nodelist" not in script  # a requeue goes where Slurm puts it
    assert "# world size 8 = 2 nodes x 4 ranks;" in script
    _, script = script_of(tmp_path, "--hostfile", hf, "--num-nodes", 2, "--pin-nodes", name="pinned")
    assert "#SBATCH --nodelist=gpu001,gpu002\n" in script
    _, script = script_of(tmp_path, "--hostfile", hf, "--exclude", "gpu002", name="excl")  # DeepSpeed's selection
    assert "#SBATCH --nodes=2" in script and "--exclude" not in "".join(sbatch_lines(script))


def test_container_flags_on_the_srun_line(tmp_path, launch_here):
    shared = tmp_path / "shared"
    manifest = shared / "data" / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text((REPO / "tests" / "launch" / "toy_data" / "manifest.json").read_text())
    for ext in ("bin", "idx"):
        (manifest.parent / f"shard_000.{ext}").write_bytes(b"")
    recipe = shared / "toy.yaml"
    recipe.write_text(TOY.read_text())
    r = launch_here("train.sh", recipe, "--backend", "slurm", "--nodes", 2, "--gpus-per-node", 2, "--dry-run",
                   "--container-image", "nvcr.io#nvidia/pytorch:25.01-py3", "--container-mounts",
                   f"{shared}:{shared},/scratch:/scratch:ro", "--log-dir", shared / "logs", "--",
                   f"data.manifests=[{manifest}]", f"checkpoint.dir={shared / 'ckpt'}")
    assert r.returncode == 0, r.stderr
    script = (shared / "logs" / "job.sbatch").read_text()
    assert subprocess.run(["bash", "-n", str(shared / "logs" / "job.sbatch")]).returncode == 0
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert srun == (f"srun --kill-on-bad-exit=1 --wait=60 --open-mode=append --output={shared}/logs/%N.log "
                    "'--container-image=nvcr.io#nvidia/pytorch:25.01-py3' "
                    f"--container-mounts={shared}:{shared},/scratch:/scratch:ro "
                    "--container-workdir=/opt/llm-recipes \\")
    # the ranks run the image's repository and venv; the job script's own bookkeeping runs outside, with ours
    assert (f"rank_cmd=(/opt/llm-recipes/.venv/bin/torchrun /opt/llm-recipes/launch/rank_exec.sh "
            f"/opt/llm-recipes/.venv/bin/python -m recipes train --config {recipe} ") in script
    assert f"export VIRTUAL_ENV=/opt/llm-recipes/.venv\n" in script
    assert f"cd {REPO}\n" in script and f"{REPO}/.venv/bin/python -m launch report-failure" in script
    # this machine's srun has no pyxis (or no Slurm configured): the dry run says a submission would be refused
    assert "submitting is refused here: `srun --help`" in r.stdout
    # a workdir of its own; the paths the ranks use must be mounted at the same path, and absolute
    r = launch_here("train.sh", TOY, "--backend", "slurm", "--nodes", 1, "--dry-run", "--container-image",
                   "/images/llm.sqsh", "--container-mounts", "/data:/mnt/data", "--container-workdir", "/work/llm",
                   "--log-dir", tmp_path / "x", "--", "checkpoint.dir=ckpt")
    assert r.returncode == 2 and not (tmp_path / "x").exists()
    assert r.stderr.splitlines()[1:] == [
        f"  - the log dir {tmp_path / 'x'} is not mounted at the same path in the container: add SRC:SRC for it to "
        "--container-mounts (now: /data:/mnt/data)",
        f"  - the recipe file {TOY} is not mounted at the same path in the container: add SRC:SRC for it to "
        "--container-mounts (now: /data:/mnt/data)",
        "  - checkpoint.dir = ckpt is relative: in the container the ranks run in /work/llm; give an absolute path on "
        "a mounted file system",
        "  - data.manifests[0] = tests/launch/toy_data/manifest.json is relative: in the container the ranks run in "
        "/work/llm; give an absolute path on a mounted file system"]


@pytest.mark.parametrize("args, needle", [
    (["--nodes", "2"], "--nodes is a Slurm option: add --backend slurm"),
    (["--backend", "torchrun-ssh", "--hostfile", "H", "--partition", "gpu"], "--partition is a Slurm option"),
    (["--backend", "slurm"], "--backend slurm needs --nodes N (Slurm picks the nodes) or --hostfile FILE"),
    (["--backend", "slurm", "--hostfile", "H", "--nodes", "2"], "--nodes is for Slurm without a hostfile"),
    (["--backend", "slurm", "--hostfile", "H", "--gpus-per-node", "2"], "its slots= give the ranks per node"),
    (["--backend", "slurm", "--nodes", "0"], "--nodes and --gpus-per-node must be at least 1"),
    (["--backend", "slurm", "--nodes", "two"], "--nodes 'two': give a number of nodes"),
    (["--backend", "slurm", "--nodes", "2", "--include", "a@b"], "--include narrows a hostfile's hosts"),
    (["--backend", "slurm", "--nodes", "2", "--pin-nodes"], "--pin-nodes narrows a hostfile's hosts"),
    (["--backend", "slurm", "--hostfile", "H", "--pin-nodes", "--nodelist", "a"], "give one"),
    (["--backend", "slurm", "--nodes", "2", "--time", "2 days"], "--time '2 days': not a value sbatch accepts"),
    (["--backend", "slurm", "--nodes", "2", "--partition", "gpu\n#SBATCH --x"], "--partition 'gpu"),
    (["--backend", "slurm", "--nodes", "2", "--nodelist", "-oProxyCommand=x"], "--nodelist '-oProxyCommand=x'"),
    (["--backend", "slurm", "--nodes", "2", "--exclude", "a@b"], "--exclude 'a@b': not a value sbatch accepts"),
    (["--backend", "slurm", "--nodes", "2", "--container-mounts", "/a:/a"], "go with --container-image IMAGE"),
    (["--backend", "slurm", "--nodes", "2", "--container-image", "img", "--container-mounts", "data:/data"],
     "--container-mounts 'data:/data': give SRC:DST[:FLAGS] with absolute paths"),
    (["--backend", "slurm", "--nodes", "2", "--container-image", "img", "--container-workdir", "work"],
     "--container-workdir 'work': give an absolute path"),
    (["--backend", "slurm", "--nodes", "2", "--container-image", "a b"], "--container-image 'a b'"),
])
def test_bad_slurm_options_refused(args, needle):
    with pytest.raises(LaunchError) as e:
        parse(["toy.yaml", *args], environ={})
    assert e.value.code == 2 and needle in str(e.value), str(e.value)


def test_time_limit_must_leave_the_requeue_grace(tmp_path):
    r = run_launch("train.sh", TOY, "--backend", "slurm", "--nodes", 1, "--time", "5", "--dry-run", "--log-dir",
                   tmp_path / "t")
    assert r.returncode == 2 and not (tmp_path / "t").exists()
    assert "--time 5 is not longer than LAUNCH_SLURM_GRACE=300 s" in r.stderr


@pytest.mark.parametrize("text, seconds", [("90", 5400), ("5:30", 330), ("48:00:00", 172800), ("2-12", 216000),
                                           ("1-02:03", 93780), ("1-00:00:07", 86407), ("UNLIMITED", None)])
def test_time_seconds_reads_sbatch_formats(text, seconds):
    assert time_seconds(text) == seconds


def test_prep_on_slurm_is_data_prep_arrays(tmp_path):
    """launch/prep.sh --backend slurm: no hostfile; `python -m data_prep slurm` writes one array task per slice with
    the request's #SBATCH lines (its scripts run on a real Slurm in tests/data_prep/test_dp_slurm.py)."""
    corpus = tmp_path / "in.jsonl"  # the inputs are probed before any script is written
    corpus.write_text('{"text": "a document"}\n')
    r = run_launch("prep.sh", "--backend", "slurm", "--tasks", 3, "--partition", "cpu", "--account", "proj",
                   "--qos", "low", "--time", "4:00:00", "--scripts-dir", tmp_path / "s", "--dry-run", "--",
                   corpus, "-o", tmp_path / "out", "-t", "tok")
    assert r.returncode == 0, r.stderr
    array = (tmp_path / "s" / "array_0000.sbatch").read_text()
    assert sbatch_lines(array)[3:8] == ["#SBATCH --time=4:00:00", "#SBATCH --partition=cpu", "#SBATCH --account=proj",
                                        "#SBATCH --qos=low", "#SBATCH --array=0-2"]
    assert "--nodelist" not in array and array in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--backend", "slurm", "--", "in"], "--backend slurm needs --tasks N"),
    (["--tasks", "3", "--", "in"], "--tasks is for --backend slurm"),
    (["--backend", "slurm", "--hostfile", "H", "--tasks", "2", "--", "in"], "--backend slurm takes no hostfile"),
    (["--backend", "pdsh", "--", "in"], "--backend 'pdsh': use ssh"),
])
def test_bad_prep_options_refused(args, needle):
    from launch.prep import parse as parse_prep, prep_slurm

    with pytest.raises(LaunchError) as e:
        o = parse_prep(args)
        prep_slurm(o)
    assert e.value.code == 2 and needle in str(e.value), str(e.value)
