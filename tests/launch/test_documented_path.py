"""The documented cluster path walked end to end with the docs' own commands and no file edited by hand (issue 22):
a corpus on a loopback S3 server -> a tokenizer -> `data_prep tokenize` from S3 to S3 -> the shards copied down (as
`aws s3 sync` would) -> `recipes plan --write-recipe` for a 2-node loopback cluster -> `launch/train.sh` on loopback
ssh "nodes" with a rank killed and the run restarted from its newest checkpoint -> `launch/stop.sh` -> a relaunch on
fewer nodes checked against the checkpoint's recorded layout before any rank starts and continued on one node ->
`export-hf` -> `evaluate`. Every command is the one a user types; the test only reads what they print."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.support import rank_forks
from tests.support.launch import REPO, launch_env
from tests.support.s3 import s3_server

# Long enough that the stop lands before the end: it is requested once the restarted job reaches step 8 and takes
# effect ~2-3 s later (stop.sh's start, its ssh to each node); at 32 steps (~0.15 s each on an unloaded machine) the
# run once finished first.
STEPS = 64
GLOBAL_BATCH, SEQ = 8, 64  # configs/models/tiny: seq_length 64


def python() -> str:
    """The user's `python`: the launcher tests' venv (tests/support/rank_forks.py), whose `-m recipes` and
    `-m data_prep` commands fork from a pre-imported template (~3-5 s of CPU less each)."""
    return rank_forks.python()


def run(argv, env, timeout=600, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"{' '.join(map(str, argv))}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def metrics(ckpt: Path) -> list[dict]:
    f = ckpt / "logs" / "metrics.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def train_losses(ckpt: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics(ckpt) if "loss" in m}


def prepare_data(tmp: Path, s3, env) -> Path:
    """Corpus on S3 -> tokenizer -> shards on S3 -> shards copied down; returns the local manifest."""
    from data_prep.tools.sample_corpus import build

    raw = tmp / "raw"
    build(str(raw), 2_000_000)  # enough documents for the default 98,2,0 split
    c = s3.client()
    c.create_bucket(Bucket="corpus")
    c.create_bucket(Bucket="shards")
    for f in raw.iterdir():
        c.upload_file(str(f), "corpus", f"web/{f.name}")
    tok = tmp / "tok" / "sp"
    run([python(), "-m", "data_prep", "train-tokenizer", raw, "-o", tok, "--vocab-size", 1000, "-q"], env)
    run([python(), "-m", "data_prep", "tokenize", "s3://corpus/web/", "-o", "s3://shards/web-v1", "-t", f"{tok}.model",
         "-j", 2, "-q"], env)
    local = tmp / "shards"
    fs = _s3fs(s3)
    fs.get("shards/web-v1/", str(local), recursive=True)  # what `aws s3 sync` does
    return local / "manifest.json"


def _s3fs(s3):
    import fsspec

    from tests.support.s3 import ACCESS_KEY, SECRET_KEY

    return fsspec.filesystem("s3", endpoint_url=s3.endpoint, key=ACCESS_KEY, secret=SECRET_KEY,
                             skip_instance_cache=True)


def rank_pid(run_id: str, rank: int) -> int | None:
    """The training process of one rank of a run (the launcher exports LAUNCH_RUN_ID to every process of it)."""
    for p in Path("/proc").iterdir():
        try:
            env = (p / "environ").read_bytes().split(b"\0")
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if p.name.isdigit() and f"LAUNCH_RUN_ID={run_id}".encode() in env and f"RANK={rank}".encode() in env \
                and b"recipes" in cmd and b"train" in cmd:
            return int(p.name)
    return None


def wait_for(what, deadline: float, proc) -> None:
    while not what():
        assert proc.poll() is None, f"the run ended early:\n{proc.stderr.read()[-5000:]}"
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


def launch_kill_restart_stop(recipe: Path, hostfile: Path, logs: Path, ckpt: Path, env):
    """train.sh on both nodes; rank 1 SIGKILLed once training runs (the supervisor restarts the job from the newest
    complete checkpoint); once the restarted job has trained to step 8, `launch/stop.sh`: the ranks save and exit."""
    p = subprocess.Popen(["bash", str(REPO / "launch" / "train.sh"), str(recipe), "--hostfile", str(hostfile),
                          "--log-dir", str(logs), "--run-id", "e2e", "--max-restarts", "1", "--quiet", "--",
                          "supervision.restart_backoff_seconds=0.5"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 1200
        wait_for(lambda: max(train_losses(ckpt), default=0) >= 3 and rank_pid("e2e", 1), deadline, p)
        os.kill(rank_pid("e2e", 1), signal.SIGKILL)
        wait_for(lambda: (logs / "restarts.jsonl").exists(), deadline, p)
        seen = len(metrics(ckpt))
        wait_for(lambda: any(m.get("step", 0) >= 8 for m in metrics(ckpt)[seen:]), deadline, p)
        run(["bash", REPO / "launch" / "stop.sh", logs], env, timeout=300)
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.ssh
@pytest.mark.timeout(1800)
def test_the_documented_cluster_path_end_to_end(ssh_cluster, tmp_path):
    config, hostfile = ssh_cluster
    with s3_server(str(tmp_path)) as s3:
        env = s3.env(**launch_env(LAUNCH_SSH_CONFIG=config))
        manifest = prepare_data(tmp_path, s3, env)

    # The plan for 2 nodes x 2 CPU ranks writes the run recipe: layout, token budget, data, checkpoint dir.
    ckpt, recipe = tmp_path / "ckpt", tmp_path / "run.yaml"
    plan = run([python(), "-m", "recipes", "plan", "models/tiny", "--cluster", "clusters/cpu-local", "--nodes", 2,
                "--gpus-per-node", 2, "--global-batch", GLOBAL_BATCH, "--tokens", STEPS * GLOBAL_BATCH * SEQ,
                "--data", manifest, "--checkpoint-dir", ckpt, "--write-recipe", recipe], env)
    assert recipe.exists(), plan.stdout

    # Launch on the two loopback nodes: rank 1 dies, the supervisor restarts the job; then a stop.
    logs = tmp_path / "launch"
    r = launch_kill_restart_stop(recipe, hostfile, logs, ckpt, env)
    assert "STOPPED: run e2e was stopped on request" in r.stderr, r.stderr[-5000:]  # exit 1: stopped, not finished
    (restart,) = [json.loads(x) for x in (logs / "restarts.jsonl").read_text().splitlines()]
    assert restart["rank"] == 1 and restart["exit_code"] == 137
    first = train_losses(ckpt)
    assert set(range(1, 9)) <= set(first) and max(first) < STEPS
    stopped_at = int((ckpt / "latest").read_text().strip().removeprefix("global_step"))
    metrics_before = metrics(ckpt)
    assert stopped_at == max(first)  # the stop saved the step it reached

    # One node left. Before any rank starts, the launcher refuses the recipe's pinned DP on 2 ranks, naming the fix;
    # with it, the checkpoint's recorded layout is checked: the plan chose ZeRO-0 for this CPU cluster, which
    # partitions nothing over DP, so the lower DP loads the same files and the run resumes (at ZeRO-1/2 it would be
    # resharded on load: tests/training/test_init_from.py, test_reshard_on_load.py).
    assert "zero_stage: 0" in recipe.read_text()
    planned = yaml.safe_load(recipe.read_text())["parallel"]
    replica = planned.get("tp", 1) * planned.get("pp", 1)
    dp = 2 // replica  # what one node's 2 ranks hold: the plan's model split kept, DP lowered
    one = tmp_path / "hosts1"
    one.write_text("node1 slots=2\n")
    relaunch = ["bash", REPO / "launch" / "train.sh", recipe, "--hostfile", one, "--log-dir", tmp_path / "l2",
                "--quiet"]
    refused = run(relaunch, env, check=False)
    assert refused.returncode == 3 and f"Fix: set parallel.dp={dp}" in refused.stderr, refused.stderr
    assert not (tmp_path / "l2" / "attempt-1").exists()  # nothing started
    cont = run([*relaunch, "--", f"parallel.dp={dp}"], env, timeout=900)
    assert "finished: all 2 ranks exited 0" in cont.stderr, cont.stderr[-3000:]
    second = {m["step"]: m["loss"] for m in metrics(ckpt)[len(metrics_before):] if "loss" in m}
    assert min(second) == stopped_at + 1 and max(second) == STEPS, sorted(second)
    assert second[STEPS] < first[1]  # it trained
    out = ckpt

    # Export and evaluate the final checkpoint.
    hf = tmp_path / "hf"
    run([python(), "-m", "recipes", "export-hf", "--checkpoint", out, "--out", hf], env)
    ev = run([python(), "-m", "recipes", "evaluate", "--model", hf, "--text", tmp_path / "raw" / "stdlib.jsonl",
              "--limit", 6, "--out", tmp_path / "eval.json"], env, timeout=900)
    result = json.loads((tmp_path / "eval.json").read_text())
    print(f"\nplan:\n{plan.stdout[-1500:]}\neval: {str(result)[:600]}")
    assert ev.returncode == 0
    assert 0 < result["scores"]["recipes_ppl/bits_per_byte"] < 8  # a language model of this text, whatever its size
