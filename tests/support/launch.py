"""Helpers for the launcher tests: run the launch scripts, pick free ports, find a run's processes, and a corpus big
enough that a data prep over ssh runs a while."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from recipes.parallel.rendezvous import free_port  # noqa: F401 (the launcher tests import it from here)

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "tests" / "launch" / "toy.yaml"
TOY_ENTRY = f"python {REPO / 'tests' / 'launch' / 'toy_train.py'}"
# A data_prep-shaped manifest with empty shard files (toy.yaml names it): what the launcher's pre-start data check
# needs for a recipe that names no data (the shipped configs/runs/*.yaml), as an override: DATA.
TOY_DATA = REPO / "tests" / "launch" / "toy_data" / "manifest.json"
DATA = f"data.manifests=[{TOY_DATA}]"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def launch_env(*, forked: bool = True, **extra) -> dict:
    """The launcher's environment in these tests. `forked`: LAUNCH_VENV is tests/support/rank_forks.py's venv, whose
    python and torchrun fork each rank, torchrun and DeepSpeed launcher from a pre-imported template (a test that
    sets LAUNCH_VENV itself gets what it sets); else, and in the unit tier (whose tests start no rank: no template
    to start), the launcher's default, the repository's .venv."""
    from tests.support import rank_forks

    env = dict(os.environ, OMP_NUM_THREADS="1", LAUNCH_STOP_GRACE="5")
    if forked and rank_forks.allowed:
        env["LAUNCH_VENV"] = str(rank_forks.venv())
    # The launcher honours these from the caller's environment; the tests state their own.
    for var in ("LAUNCH_SSH_CONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_launch(script: str, *args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "launch" / script), *map(str, args)], cwd=REPO, env=env or launch_env(),
                          capture_output=True, text=True, timeout=timeout)


def run_pids(run_id: str) -> list[int]:
    """Every process on this machine that belongs to a launch (the launcher exports LAUNCH_RUN_ID to all of them)."""
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and f"LAUNCH_RUN_ID={run_id}".encode() in (p / "environ").read_bytes().split(b"\0"):
                pids.append(int(p.name))
        except OSError:
            pass
    return pids


def tokenize_pids(out: Path) -> list[int]:
    """The `data_prep tokenize` slice processes writing into `out` (not the final --merge-only)."""
    pids = []
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if p.name.isdigit() and b"data_prep" in cmd and b"tokenize" in cmd and str(out).encode() in cmd \
                and b"--merge-only" not in cmd:
            pids.append(int(p.name))
    return pids


def big_prep_corpus(tmp_path: Path) -> tuple[Path, str]:
    """(a corpus directory of ~140 MB, a small sentencepiece model): enough text for tokenize to run a while on every
    node, in several units."""
    from data_prep.steps.train_tokenizer import train

    texts = [f"document {i} " + "some words of text that repeat " * 40 for i in range(200)]
    (tmp_path / "sample.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    model = train([str(tmp_path / "sample.jsonl")], str(tmp_path / "sp"), vocab_size=300, threads=1, quiet=True)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    line = "".join(json.dumps({"text": t + str(k)}) + "\n" for k, t in enumerate(texts))
    for i in range(4):
        (corpus / f"part{i}.jsonl").write_text(line * 150)
    return corpus, model
