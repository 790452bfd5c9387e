"""The launcher refuses every recipe and data mistake, and a plan that does not fit the world it would start, before
anything starts: in `--dry-run` and preflight alike (one line per problem with its fix; exit 2 for the recipe and
its data, 3 for the world: layout, memory), with no log dir written. The messages are the ones `recipes train`
itself would give (recipes.planner.validation.validate_for_launch), asserted here as the launcher prints them. The
last test proves, for a real (not dry) launch, that no process is started at all: the launcher runs under a Python
audit hook that records every process it would start."""
import json
import shlex
import subprocess
import sys

import pytest

from tests.support.checkpoints import recorded_tag
from tests.support.launch import DATA, REPO, launch_env, run_launch

TINY = REPO / "configs" / "runs" / "tiny-cpu.yaml"      # model.vocab_size 320, names no data
L70 = REPO / "configs" / "runs" / "llama-70b-16x8-h100.yaml"  # TP=2 x PP=16 on 16 x 8 H100, global batch 1024


def refused(launch, tmp_path, recipe, *args, script="train.sh", code=2):
    """Run SCRIPT RECIPE ARGS (a dry run for train.sh) with `launch` (in process, or `run_launch` in a subprocess);
    assert the exit code and that no log dir was written."""
    logs = tmp_path / "logs"
    cut = args.index("--") if "--" in args else len(args)
    extra = ["--dry-run", "--log-dir", logs] if script == "train.sh" else []
    r = launch(script, recipe, *args[:cut], *extra, *args[cut:])
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert not logs.exists()  # refused before a log dir, let alone a rank
    return r.stderr


def write_manifest(d, vocab=257, text=None):
    d.mkdir(parents=True, exist_ok=True)
    m = d / "manifest.json"
    m.write_text(text if text is not None else json.dumps(
        {"tokenizer": {"vocab_size": vocab, "eod_id": 0}, "dtype": "uint16", "shards": [{"prefix": "shard_000"}]}))
    for ext in ("bin", "idx"):
        (d / f"shard_000.{ext}").write_bytes(b"")
    return m


LOCAL = ["--backend", "local", "--num-gpus", "2"]


@pytest.mark.unit
def test_every_recipe_and_data_mistake_refused_in_the_dry_run(tmp_path, launch_here):
    head = "[launch] error: recipe 'tiny-cpu' cannot start:\n  - "
    err = refused(run_launch, tmp_path, TINY, *LOCAL)  # through the shim once; the rest in process (same code)
    assert err == head + ("data: the recipe names no training data (data.manifests, data.blend and data.stages are "
                          "all empty); set data.manifests=[DIR/manifest.json], the manifest that `python -m data_prep "
                          "tokenize INPUTS -o DIR -t TOKENIZER` writes\n")
    gone = tmp_path / "corpus" / "manifest.json"
    err = refused(launch_here, tmp_path, TINY, *LOCAL, "--", f"data.manifests=[{gone}]")
    assert err == head + (f"data.manifests[0] = {gone}: {gone} not found; build it with `python -m data_prep tokenize "
                          f"INPUTS -o {gone.parent} -t TOKENIZER`, or fix the path\n")
    bad = write_manifest(tmp_path / "bad", text='{"tokenizer": ')
    err = refused(launch_here, tmp_path, TINY, *LOCAL, "--", f"data.manifests=[{bad}]")
    assert err.startswith(head + f"data.manifests[0]: {bad}:1:15: not valid JSON (Expecting value); rewrite it: "
                                 f"`python -m data_prep tokenize INPUTS -o {bad.parent} -t TOKENIZER`")
    big = write_manifest(tmp_path / "big", vocab=5000)
    err = refused(launch_here, tmp_path, TINY, *LOCAL, "--", f"data.manifests=[{big}]")
    assert err.startswith(head + f"model.vocab_size = 320 is smaller than the vocabulary of the tokenizer {big} was "
                                 "written with (5000 ids): token ids >= 320 have no embedding; set "
                                 "model.vocab_size=5000")
    err = refused(launch_here, tmp_path, TINY, *LOCAL, "--", DATA, "training.train_steps=null")
    assert err.startswith(head + "training: the recipe sets no train length (training.train_tokens and "
                                 "training.train_steps are both empty); set training.train_tokens=N")
    err = refused(launch_here, tmp_path, TINY, *LOCAL, "--", DATA, "training.train_steps=10000000")
    assert err.startswith(head + "checkpoint.dir: not set, and this run is predicted to take ")
    assert "(10,000,000 steps x " in err and "checkpoint.require_dir=false to run without checkpoints" in err
    # several at once: each its own line
    err = refused(launch_here, tmp_path, TINY, *LOCAL, "--", "training.train_steps=null",
                  f"data.manifests=[{gone}]")
    assert err.startswith("[launch] error: recipe 'tiny-cpu' cannot start: 2 problem(s):\n  - training: ")
    assert f"\n  - data.manifests[0] = {gone}: {gone} not found" in err
    # the same recipe with its data is accepted (the refusals above are the mistakes, not the recipe)
    r = launch_here("train.sh", TINY, *LOCAL, "--dry-run", "--log-dir", tmp_path / "ok", "--", DATA)
    assert r.returncode == 0, r.stderr


@pytest.mark.unit
def test_preflight_refuses_the_same_before_any_node_is_asked(tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("node-that-does-not-exist slots=2\n")  # never contacted: the recipe is refused first
    err = refused(run_launch, tmp_path, TINY, "--hostfile", hf, "--backend", "torchrun-ssh", script="preflight.sh")
    assert "data: the recipe names no training data" in err and "unreachable" not in err
    err = refused(run_launch, tmp_path, L70, "--hostfile", _hostfile(tmp_path, 4, 8), "--", DATA,
                  script="preflight.sh", code=3)
    assert "memory check failed for 32 ranks (the hostfile selection): predicted memory per GPU 83.7 GiB" in err
    r = run_launch("preflight.sh", TINY, "--backend", "slurm", "--nodes", 1, "--gpus-per-node", 2, "--", DATA)
    assert r.returncode == 0, r.stderr  # Slurm picks the nodes: the recipe is checked, no node is
    assert "no node is checked here (the recipe is ready)" in r.stderr


def _hostfile(tmp_path, nodes, slots):
    p = tmp_path / f"hosts{nodes}"
    p.write_text("".join(f"gpu{i:03d} slots={slots}\n" for i in range(nodes)))
    return p


@pytest.mark.unit
def test_the_plan_is_checked_for_the_world_it_starts(tmp_path, launch_here):
    """llama-70b-16x8-h100 is planned for 16 x 8 H100 (DP=4). On 4 nodes (DP=1) the planner predicts 83.7 GiB per GPU:
    refused naming `recipes plan` for that world and `recipes reshape` for the checkpoints. On 12 nodes DP=3 does not
    divide the global batch: refused, saying how DP and the micro-batches change. On 8 nodes it starts, and the plan
    says how DP, micro-batches and tokens per DP rank change, and that memory is inside the headroom."""
    err = refused(launch_here, tmp_path, L70, "--backend", "slurm", "--nodes", 4, "--", DATA, code=3)
    assert err.startswith("[launch] error: memory check failed for 32 ranks (--nodes 4 x --gpus-per-node 8): "
                          "predicted memory per GPU 83.7 GiB exceeds cluster.gpu_memory_gb=80 (80 GB (74.5 GiB)) for "
                          "TP=2 x PP=16 x DP=1, ZeRO-1, micro-batch 1, SP: ")
    assert f"\n  choose a layout that fits this world: `python -m recipes plan {L70} {shlex.quote(DATA)} --nodes 4 " \
           "--gpus-per-node 8`; then set the parallel.* keys it prints (after --), and move this run's checkpoints " \
           f"to that layout with `python -m recipes reshape --checkpoint {REPO}/checkpoints/llama-70b-16x8-h100 " \
           "--out NEW_DIR --to tp=T,pp=P,dp=D` (continue with checkpoint.dir=NEW_DIR)\n" in err
    # the same through a hostfile of 4 nodes x 8
    err = refused(launch_here, tmp_path, L70, "--hostfile", _hostfile(tmp_path, 4, 8), "--backend", "torchrun-ssh",
                  "--", DATA, code=3)
    assert "memory check failed for 32 ranks (the hostfile selection): predicted memory per GPU 83.7 GiB" in err
    err = refused(launch_here, tmp_path, L70, "--backend", "slurm", "--nodes", 12, "--", DATA, code=3)
    assert ("world: 96 ranks (--nodes 12 x --gpus-per-node 8), not the recipe's cluster.nodes x gpus_per_node = 16 x "
            "8 = 128: DP 4 -> 3; micro-batches per step on each DP rank 256 -> 341.333 (not whole)") in err
    assert "training.global_batch=1024 is not a multiple of parallel.micro_batch x dp = 1 x 3 = 3" in err
    r = launch_here("train.sh", L70, "--backend", "slurm", "--nodes", 8, "--dry-run", "--log-dir", tmp_path / "ok",
                   "--", DATA)
    assert r.returncode == 0, r.stderr
    assert ("world: 64 ranks (--nodes 8 x --gpus-per-node 8), not the recipe's cluster.nodes x gpus_per_node = 16 x 8 "
            "= 128: DP 4 -> 2; micro-batches per step on each DP rank 256 -> 512 (global batch 1024 = micro-batch 1 x "
            "DP x micro-batches); tokens per step stay 4,194,304 (global batch x seq_length), per DP rank 1,048,576 -> "
            "2,097,152\n") in r.stdout
    assert "memory: predicted memory per GPU 70.6 GiB for TP=2 x PP=16 x DP=2" in r.stdout
    assert "but not the 67.1 GiB budget that leaves 10% headroom" in r.stdout
    # at the recipe's own world nothing is said about a change
    r = launch_here("train.sh", L70, "--backend", "slurm", "--nodes", 16, "--dry-run", "--log-dir", tmp_path / "own",
                   "--", DATA)
    assert r.returncode == 0, r.stderr
    assert "world:" not in r.stdout and "TP=2 x PP=16 x DP=4" in r.stdout


PROBE = r"""
import json, sys
started = []
def hook(event, args):
    if event in ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system"):
        started.append(event + " " + " ".join(map(str, args[1] if event == "subprocess.Popen" else args))[:300])
sys.addaudithook(hook)
from launch.cli import main
rc = main(sys.argv[1:])
print("PROBE " + json.dumps({"rc": rc, "started": started}))
"""


@pytest.mark.multiproc
@pytest.mark.parametrize("backend", [["--backend", "local", "--num-gpus", "2"], ["--backend", "slurm", "--nodes", "1"]])
def test_a_real_launch_refused_starts_no_process(tmp_path, backend):
    """Not a dry run: the launcher would start torchrun (local) or submit with sbatch (Slurm). Refused for a recipe
    without data, it starts nothing: no process at all (the audit hook sees every subprocess, fork and exec), no log
    dir (no exit record, no heartbeat dir)."""
    logs = tmp_path / "logs"
    r = subprocess.run([sys.executable, "-c", PROBE, "train", str(TINY), *backend, "--log-dir", str(logs)],
                       cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=120)
    probe = json.loads(next(line[6:] for line in r.stdout.splitlines() if line.startswith("PROBE ")))
    assert probe == {"rc": 2, "started": []}, (probe, r.stderr)
    assert "data: the recipe names no training data" in r.stderr
    assert not logs.exists()
    # with its data the same launch does start a process (the probe would see one)
    r = subprocess.run([sys.executable, "-c", PROBE, "train", str(TINY), "--backend", "local", "--num-gpus", "2",
                        "--log-dir", str(tmp_path / "ok"), "--quiet", "--entry", "python -c pass", "--", DATA],
                       cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=300)
    probe = json.loads(next(line[6:] for line in r.stdout.splitlines() if line.startswith("PROBE ")))
    assert any("torchrun" in s for s in probe["started"]), (probe, r.stderr[-2000:])


@pytest.mark.unit
def test_a_relaunch_over_checkpoints_it_cannot_reshard_is_refused_with_the_fix(tmp_path, launch_here):
    """checkpoint.dir holds a TP=2 ZeRO-1 checkpoint (its complete.json records the layout). Launched at another
    layout it is resharded on load (accepted); launched as ZeRO-3, which resharding on load cannot fill, the dry run
    and preflight refuse it before anything starts, saying how to resume."""
    ck = tmp_path / "ck"
    recorded_tag(ck, str(TINY), "parallel.tp=2", world=2)
    fix = "resume at parallel.zero_stage=2 (`recipes train` reshards it on load)"
    err = refused(launch_here, tmp_path, TINY, *LOCAL, "--", DATA, f"checkpoint.dir={ck}", "parallel.zero_stage=3")
    assert err.startswith(f"[launch] error: recipe 'tiny-cpu' cannot start:\n  - checkpoint.dir = {ck} holds "
                          "global_step4, saved at TP=2 x CP=1 x PP=1 x DP=1, ZeRO-1, ")
    assert fix in err and err.count("\n") == 2, err
    hf = tmp_path / "hostfile"
    hf.write_text("node-that-does-not-exist slots=2\n")  # never contacted: the recipe is refused first
    err = refused(launch_here, tmp_path, TINY, "--hostfile", hf, "--backend", "torchrun-ssh", "--", DATA,
                  f"checkpoint.dir={ck}", "parallel.zero_stage=3", script="preflight.sh")
    assert fix in err and "unreachable" not in err
    for layout in (["parallel.tp=2"], ["parallel.tp=1"]):  # the saved layout, and another one (resharded on load)
        r = launch_here("train.sh", TINY, *LOCAL, "--dry-run", "--log-dir", tmp_path / f"ok{layout[0][-1]}", "--",
                        DATA, f"checkpoint.dir={ck}", *layout)
        assert r.returncode == 0, r.stderr


@pytest.mark.multiproc
def test_a_real_relaunch_at_another_layout_starts_no_process(tmp_path):
    """Not a dry run: refused for the layout of its checkpoints (ZeRO-3 over a ZeRO-1 checkpoint), the launcher starts
    no process at all."""
    ck = tmp_path / "ck"
    recorded_tag(ck, str(TINY), "parallel.tp=2", world=2)
    logs = tmp_path / "logs"
    r = subprocess.run([sys.executable, "-c", PROBE, "train", str(TINY), *LOCAL, "--log-dir", str(logs), "--", DATA,
                        f"checkpoint.dir={ck}", "parallel.zero_stage=3"], cwd=REPO, env=launch_env(),
                       capture_output=True, text=True, timeout=120)
    probe = json.loads(next(line[6:] for line in r.stdout.splitlines() if line.startswith("PROBE ")))
    assert probe == {"rc": 2, "started": []}, (probe, r.stderr)
    assert "resume at parallel.zero_stage=2 (`recipes train` reshards it on load)" in r.stderr
    assert not logs.exists()
