"""`recipes train` refuses every recipe and data mistake before any rank process exists: exit 2, the message naming
the field or file (the checkpoint refusals too: a checkpoint.dir that cannot be resharded to the launch's layout, or
holding another model; a checkpoint.init_from missing or of another model). Proof, per refusal: `recipes.train.cli.main` runs in a fresh
interpreter under a Python audit hook that records every process it would start (subprocess.Popen, fork, exec,
posix_spawn) and every import of the training loop; with `--local 2` nothing may be started, and as a rank under a
launcher (WORLD_SIZE=2, RANK=0) neither the loop nor a process group may exist when it returns."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recipes.test_validation_launch import write_manifest
from tests.support.checkpoints import recorded_tag

pytestmark = pytest.mark.multiproc

REPO = Path(__file__).resolve().parents[2]
TINY = "configs/runs/tiny-cpu.yaml"

PROBE = r'''
import contextlib, io, json, os, sys
seen = []
def hook(event, args):
    if event in ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system"):
        seen.append(event + " " + " ".join(map(str, args[1] if event == "subprocess.Popen" else args))[:200])
        STOP_AT_RANK
    elif event == "import" and args[0] in ("recipes.train.trainer", "deepspeed"):
        seen.append("import " + args[0])
sys.addaudithook(hook)
from recipes.train.cli import main
results = {}
for name, argv, env in json.loads(sys.argv[1]):
    os.environ.update(env)
    seen.clear()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    dist = sys.modules.get("torch.distributed")
    results[name] = {"rc": rc, "err": err.getvalue(), "started": list(seen),
                     "process_group": bool(dist and dist.is_available() and dist.is_initialized())}
print(json.dumps(results))
'''


def cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (overrides, a line the refusal must hold)."""
    corrupt = tmp / "corrupt" / "manifest.json"
    corrupt.parent.mkdir()
    corrupt.write_text('{"tokenizer": {"vocab_size": 257,, }')
    good = write_manifest(tmp / "good")
    tp2 = tmp / "tp2"
    recorded_tag(tp2, TINY, "parallel.tp=2", world=2)
    return {
        "no data": ([], "data: the recipe names no training data"),
        "missing manifest": ([f"data.manifests=[{tmp / 'gone' / 'manifest.json'}]"],
                             f"{tmp / 'gone' / 'manifest.json'} not found; build it with `python -m data_prep "
                             f"tokenize INPUTS -o {tmp / 'gone'} -t TOKENIZER`"),
        "corrupt manifest": ([f"data.manifests=[{corrupt}]"], f"{corrupt}:1:34: not valid JSON"),
        "empty manifest": ([f"data.manifests=[{write_manifest(tmp / 'empty', shards=0)}]"], "holds no shards"),
        "shards missing": ([f"data.manifests=[{write_manifest(tmp / 'nobin', files=False)}]"],
                           "1 of the 1 shards"),
        "vocabulary too big": ([f"data.manifests=[{write_manifest(tmp / 'v', vocab=32000)}]"],
                               "model.vocab_size = 320 is smaller than the vocabulary of the tokenizer"),
        "no train length": ([f"data.manifests=[{good}]", "training.train_steps=null"],
                            "training: the recipe sets no train length"),
        "no checkpoint dir on a long run": ([f"data.manifests=[{good}]", "training.train_steps=3000000",
                                             "checkpoint.dir=null"], "checkpoint.dir: not set, and this run is "
                                                                     "predicted to take"),
        # a TP=2 checkpoint relaunched as ZeRO-3 (resharding on load fills ZeRO-0/1/2 engines; both cases 2 ranks)
        "relaunch at a layout it cannot reshard to": ([f"data.manifests=[{good}]", f"checkpoint.dir={tp2}",
                                                       "parallel.zero_stage=3"],
                                                      "resume at parallel.zero_stage=2 (`recipes train` reshards it "
                                                      "on load)"),
        "relaunch of another model": ([f"data.manifests=[{good}]", f"checkpoint.dir={tp2}", "model.num_layers=2"],
                                      f"checkpoint.dir = {tp2} holds global_step4 of another model "
                                      "(model.num_layers=4); this recipe has model.num_layers=2"),
        "init_from missing": ([f"data.manifests=[{good}]", f"checkpoint.init_from={tmp / 'gone'}"],
                              f"checkpoint.init_from = {tmp / 'gone'}: "),
        "init_from of another model": ([f"data.manifests=[{good}]", f"checkpoint.init_from={tp2}",
                                        "model.hidden_size=128"], "holds a model with model.hidden_size=64; this "
                                                                  "recipe has model.hidden_size=128"),
    }


def test_train_refuses_before_any_rank_exists(tmp_path):
    table = cases(tmp_path)
    runs = []
    for name, (overrides, _) in table.items():
        argv = ["--config", TINY, "--quiet", f"checkpoint.dir={tmp_path / 'ck'}", *overrides]
        runs.append([f"{name} / --local 2", ["--local", "2", *argv], {}])
        runs.append([f"{name} / rank", argv, {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
                                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}])
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    probe = PROBE.replace("STOP_AT_RANK", "pass")
    p = subprocess.run([sys.executable, "-c", probe, json.dumps(runs)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    results = json.loads(p.stdout.strip().splitlines()[-1])
    for name, (_, expect) in table.items():
        for how in ("--local 2", "rank"):
            r = results[f"{name} / {how}"]
            assert r["rc"] == 2, (name, how, r)
            assert r["err"].startswith("error: recipe 'tiny-cpu' cannot start"), (name, how, r["err"])
            assert expect in r["err"], (name, how, expect, r["err"])
            assert "Traceback" not in r["err"]
            assert r["started"] == [], (name, how, r["started"])  # no rank process, no training loop imported
            assert not r["process_group"], (name, how)


def test_a_good_recipe_does_start_ranks(tmp_path):
    """The probe can see a start: the same recipe with its data in order gets past the checks and spawns ranks
    (stopped at once: the audit hook raising in the parent at the first fork or Popen stops the spawn loop)."""
    good = write_manifest(tmp_path / "good")
    # the first rank's start: a fork (ranks forked from the template) or a Popen of `recipes train` (fresh ranks);
    # any other process a library starts on the way (e.g. ldconfig) does not count
    probe = PROBE.replace("STOP_AT_RANK", "if seen[-1].startswith('os.fork') or ('recipes' in seen[-1] and 'train' in "
                                          "seen[-1]): raise SystemExit(7)")
    runs = [["good", ["--local", "2", "--config", TINY, f"data.manifests=[{good}]",
                      f"checkpoint.dir={tmp_path / 'ck'}"], {}]]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, "-c", probe, json.dumps(runs)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 7, (p.returncode, p.stderr[-3000:])  # the start of the first rank was seen
