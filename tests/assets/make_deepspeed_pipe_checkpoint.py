"""How tests/assets/deepspeed_pipe_checkpoint.tar.xz was made: a checkpoint written by DeepSpeed's pipeline engine
(PipelineModule, per-layer files `layer_XX-model_TT-model_states.pt`), the training path of this project up to commit
9f66cc0. It cannot be made again from later commits (that engine is gone from recipes/); it is kept so that the
readers of today are tested on what earlier runs wrote: resume, export-hf, reshape, init_from.

    git checkout 9f66cc0 && .venv/bin/python -m tests.assets.make_deepspeed_pipe_checkpoint OUT_DIR

The run: the tiny recipe shrunk (hidden 32, ffn 64, vocab 320, tied embeddings), TP2 x PP2 x DP1, ZeRO-1, fp32, on
tests.support.corpus.write_corpus's corpus (the running Python's stdlib sources), saved at step 2. `expected.json`
holds what the old code measured on the same data: the per-step losses of an uninterrupted 4-step run (so a resume
from step 2 can be compared), and each canonical tensor's sum and norm (weights and Adam moments) as the offline
reader of the old code read them, and the corpus digest they hold for.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHAPE = ["model.hidden_size=32", "model.ffn_hidden_size=64", "model.tied_embeddings=true", "model.vocab_size=320"]
LAYOUT = ["parallel.tp=2", "parallel.pp=2", "parallel.zero_stage=1"]
STEPS = 4


def corpus_digest(manifest: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(manifest.parent.glob("shard_*")):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def train(out: Path, manifest: Path, steps: int, save: int) -> None:
    cmd = [sys.executable, "-m", "recipes", "train", "--config", str(REPO / "configs/runs/tiny-cpu.yaml"), "--local",
           "4", "--quiet", f"data.manifests=[{manifest}]", f"checkpoint.dir={out}", f"training.train_steps={steps}",
           f"checkpoint.save_interval={save}", "training.eval_interval=1000", "logging.tensorboard=false", *SHAPE,
           *LAYOUT]
    subprocess.run(cmd, check=True, cwd=REPO)


def tensor_stats(state: dict) -> dict:
    return {k: [float(v.double().sum()), float(v.double().norm())] for k, v in state.items()}


def main(out_dir: str) -> None:
    from recipes.checkpoint.format.read import read_full_state
    from recipes.checkpoint.recipe_file import load_checkpoint_recipe
    from tests.support.corpus import write_corpus

    out = Path(out_dir)
    manifest = write_corpus(out / "corpus")
    ckpt, full = out / "ckpt", out / "full"
    train(ckpt, manifest, 2, 2)
    train(full, manifest, STEPS, 1000)
    recipe = load_checkpoint_recipe(str(ckpt), None, [])
    state = read_full_state(ckpt, recipe.model, with_moments=True)
    losses = {r["step"]: r["loss"] for r in map(json.loads, (full / "logs/metrics.jsonl").read_text().splitlines())
              if "loss" in r}
    expected = {"made_by": "commit 9f66cc0 (DeepSpeed 0.19.8 PipelineEngine)", "overrides": SHAPE + LAYOUT,
                "corpus_sha256": corpus_digest(manifest), "losses": losses,
                "weights": tensor_stats(state.weights), "exp_avg": tensor_stats(state.exp_avg),
                "exp_avg_sq": tensor_stats(state.exp_avg_sq)}
    shutil.rmtree(ckpt / "logs", ignore_errors=True)
    shutil.rmtree(ckpt / "data_cache", ignore_errors=True)
    (ckpt / "expected.json").write_text(json.dumps(expected, indent=1))
    with tarfile.open(REPO / "tests/assets/deepspeed_pipe_checkpoint.tar.xz", "w:xz") as tar:
        tar.add(ckpt, arcname="deepspeed_pipe_checkpoint")


if __name__ == "__main__":
    main(sys.argv[1])
