"""W&B tracking across a restart (issue 26, item 3), in W&B's offline mode (files on disk, no network): a real two-rank
run killed with SIGKILL, then resumed with the same command. W&B offline writes one directory per process; both
carry the same run id (so `wandb sync` appends them to one W&B run), the second resumes it, and the steps it logs
follow the steps logged before the kill, with the values metrics.jsonl holds. The .wandb files are read back with a
reader of W&B's record log (wandb 0.31 ships no Python reader) into wandb's own protobuf records."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.runs import REPO, kill_group, losses, on_corpus, pretrain_cmd, recipes_cli, worker_env

pytestmark = pytest.mark.multiproc

STEPS = 10
ARGS = [f"training.train_steps={STEPS}", "checkpoint.save_interval=2", "checkpoint.async_save=false",
        "logging.wandb={project: recipes-test, group: g1, tags: [ci, offline]}"]
_BLOCK, _HEADER = 32768, 7  # W&B's record log: LevelDB's log format after a 7-byte ":W&B" header


def wandb_records(path: Path):
    """The protobuf Records of one .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, chunk = path.read_bytes(), _HEADER, b""
    assert data[:4] == b":W&B", path
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + n > len(data):  # a record still being written (a live run's file)
            return
        if kind == 0:  # zero fill to the block's end
            pos += left
            continue
        chunk += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL or LAST
            rec = pb.Record()
            rec.ParseFromString(chunk)
            yield rec
            chunk = b""


def read_run(run_dir: Path) -> dict:
    """run id, config keys and {step: loss} of one offline run directory."""
    (wandb_file,) = run_dir.glob("*.wandb")
    out = {"id": None, "config": set(), "tags": [], "group": None, "loss": {}}
    for rec in wandb_records(wandb_file):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out.update(id=rec.run.run_id, group=rec.run.run_group, tags=list(rec.run.tags))
            out["config"] |= {u.key for u in rec.run.config.update}
        elif kind == "config":
            out["config"] |= {u.key for u in rec.config.update}
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            if "loss" in items:
                out["loss"][items["_step"]] = items["loss"]
    return out


def _logged_through_a_checkpoint(run: Path, wandb_root: Path) -> bool:
    """A complete checkpoint exists and the W&B file already holds every step up to it."""
    latest = run / "latest"
    dirs = sorted(wandb_root.glob("offline-run-*"))
    if not latest.is_file() or not dirs or not list(dirs[0].glob("*.wandb")):
        return False
    saved = json.loads((run / latest.read_text().strip() / "complete.json").read_text())["step"]
    return set(range(1, saved + 1)) <= set(read_run(dirs[0])["loss"])


def _kill_when(cmd, ready, env) -> None:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 600
        while not ready():
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.time() < deadline, "no checkpoint logged to W&B in time"
            time.sleep(0.2)
    finally:
        kill_group(proc)  # launcher, every rank and wandb-core: no save, no W&B finish


def test_a_killed_run_resumes_the_same_wandb_run(corpus, tmp_path):
    wandb_root = tmp_path / "wandb_dir" / "wandb"
    # W&B flushes its file every 15 s by default; every second here, so that what the killed process logged is on
    # disk when it dies (online, W&B would have streamed it to the server).
    env = dict(worker_env(), WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "wandb_dir"), WANDB_SILENT="true",
               WANDB_X_TRANSACTION_LOG_FLUSH_INTERVAL="1")
    env.pop("WANDB_API_KEY", None)
    run = tmp_path / "run"
    # rank 0 slowed (~1.6 s a step, numerics unchanged): on a loaded machine W&B's flush could otherwise trail the
    # last step, and the run would end before it could be killed
    slow = dict(env, RECIPES_TEST_FAULT="slow rank=0 step=1 seconds=0.4")
    _kill_when(pretrain_cmd(2, *on_corpus(run, corpus), *ARGS), lambda: _logged_through_a_checkpoint(run, wandb_root),
               slow)
    resumed_from = json.loads((run / (run / "latest").read_text().strip() / "complete.json").read_text())
    assert resumed_from["client_state"]["wandb_run_id"]  # the id travels in the checkpoint
    k = resumed_from["step"]
    assert k < STEPS

    resumed = recipes_cli(pretrain_cmd(2, *on_corpus(run, corpus), *ARGS)[3:], env=env, timeout=900)  # forked
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    dirs = sorted(wandb_root.glob("offline-run-*"))
    assert len(dirs) == 2, dirs  # one per process
    first, second = read_run(dirs[0]), read_run(dirs[1])
    assert first["id"] == second["id"] == resumed_from["client_state"]["wandb_run_id"]
    assert all(d.name.endswith(first["id"]) for d in dirs)
    assert first["group"] == "g1" and first["tags"] == ["ci", "offline"]
    # The recipe and the plan once, when the W&B run was created; not again on resume.
    assert {"recipe", "plan"} <= first["config"] and not {"recipe", "plan"} & second["config"]

    # Continuous: the first process logged 1..m (m >= the checkpoint's step), the second the steps after it.
    assert sorted(first["loss"]) == list(range(1, len(first["loss"]) + 1)) and len(first["loss"]) >= k
    assert sorted(second["loss"]) == list(range(k + 1, STEPS + 1))
    reference = losses(run)  # metrics.jsonl, the same records (the resumed run's re-run steps are bit-equal)
    assert {**first["loss"], **second["loss"]} == {s: reference[s] for s in range(1, STEPS + 1)}


def test_without_wandb_installed_the_recipe_is_refused_before_any_rank(corpus, tmp_path):
    """wandb out of reach as if it were not installed (sitecustomize makes the path finder find no `wandb`): one
    refusal that names the extra, exit 2, no worker started, nothing written to the checkpoint directory."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "from importlib.machinery import PathFinder\n"
        "_find = PathFinder.find_spec\n"
        "def _no_wandb(cls, name, path=None, target=None):\n"
        "    return None if name.partition('.')[0] == 'wandb' else _find(name, path, target)\n"
        "PathFinder.find_spec = classmethod(_no_wandb)\n")
    env = dict(worker_env(), PYTHONPATH=str(hide))
    probe = [sys.executable, "-c", "import wandb"]
    assert subprocess.run(probe, env=worker_env(), capture_output=True).returncode == 0  # installed here...
    assert subprocess.run(probe, env=env, capture_output=True).returncode != 0  # ...and out of reach with the finder
    r = subprocess.run(pretrain_cmd(2, *on_corpus(tmp_path / "run2", corpus), *ARGS), cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "pip install '.[wandb]'" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "layout:" not in r.stdout and not (tmp_path / "run2").exists()
