"""The main job: corpus -> tokenizer -> shards -> plan -> TP x PP x ZeRO-DP training -> eval -> HF export -> generation
-> report, on the embedded sample corpus, with no GPU and no download.

    python -m recipes demo [--out runs/demo] [--steps 80] [--corpus-mb 4] [--moe]

--moe trains the mixture-of-experts variant (configs/runs/demo-moe-cpu.yaml: 8 experts, top-2, split over 2 EP
ranks inside DP) and exports it as a transformers Mixtral model.

Every stage runs the project's own command line (the same commands a user runs by hand), so the printed commands
are a walkthrough. Local GPUs are used when present (torchrun, NCCL, bf16); otherwise 8 CPU processes with gloo.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from recipes.config.cli_help import command_parser

REPO = Path(__file__).resolve().parents[2]
DEMO_RECIPE = REPO / "configs" / "runs" / "demo-cpu.yaml"
DEMO_MOE_RECIPE = REPO / "configs" / "runs" / "demo-moe-cpu.yaml"
BIG_EXAMPLE = REPO / "configs" / "examples" / "a-glm-130b-100x8-a100.yaml"
PROMPT = "def read_file(path):\n    "


class StageFailed(RuntimeError):
    pass


class Stages:
    """Numbered stage headers with timings; each stage's command is printed before it runs."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.n, self.quiet = total, 0, quiet
        self.timings: list[tuple[str, float]] = []

    def run(self, title: str, cmd: list[str], capture: bool = False, env: dict | None = None) -> str:
        self.n += 1
        print(f"\n[{self.n}/{self.total}] {title}\n  $ {shlex.join(cmd)}", flush=True)
        t0 = time.time()
        res = subprocess.run(cmd, cwd=REPO, env=env, text=True,
                             stdout=subprocess.PIPE if capture else None)
        dt = time.time() - t0
        self.timings.append((title, dt))
        if res.returncode != 0:
            raise StageFailed(f"stage '{title}' failed with exit code {res.returncode}: {shlex.join(cmd)}")
        print(f"  done in {dt:.1f}s", flush=True)
        return res.stdout or ""

    def note(self, title: str, seconds: float) -> None:
        self.n += 1
        self.timings.append((title, seconds))


def _local_devices() -> tuple[int, str]:
    try:
        import torch

        n = torch.cuda.device_count()
    except Exception:  # torch missing or broken CUDA: the CPU path still works
        n = 0
    return (n, "cuda") if n > 0 else (8, "cpu")


def _layout_for(world: int) -> tuple[int, int]:
    """TP x PP for the demo: the full 2 x 2 (x DP) hybrid when the world allows it, smaller otherwise."""
    tp = 2 if world % 2 == 0 else 1
    pp = 2 if world % (tp * 2) == 0 and world >= 4 else 1
    return tp, pp


def generate(hf_dir: Path, prompt: str, max_new_tokens: int = 48) -> str:
    """Greedy text from the exported model, loaded by plain transformers (offline)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True, dtype=torch.float32)
    model.eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, repetition_penalty=1.3,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    return tok.decode(out[0], skip_special_tokens=True)


def _parse(argv: list[str] | None):
    ap = command_parser("python -m recipes demo", __doc__)
    ap.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    ap.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    ap.add_argument("--corpus-mb", type=float, default=4.0, help="size of the sample corpus in MB (default 4)")
    ap.add_argument("--vocab", type=int, default=3000, help="tokenizer vocabulary size (default 3000)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument("--moe", action="store_true", help="the mixture-of-experts variant (expert parallelism, exported "
                    "as Mixtral); default --out runs/demo-moe")
    ns = ap.parse_args(argv)
    if ns.moe and ns.out == "runs/demo":
        ns.out = "runs/demo-moe"
    return ns


def _data(st: Stages, ns, data_dir: Path) -> Path:
    """1-2. sample corpus (Python stdlib, PSF licence) -> sentencepiece -> shards -> verify; the manifest."""
    py, q = sys.executable, ["--quiet"] if ns.quiet else []
    st.run("data: sample corpus from the Python standard library (PSF licence)",
           [py, "-m", "data_prep", "sample-corpus", str(data_dir / "corpus"), "--max-mb", str(ns.corpus_mb)])
    corpus = sorted((data_dir / "corpus").glob("*.jsonl"))
    tok_prefix = data_dir / "tokenizer" / "sp"
    st.run("data: train a sentencepiece BPE tokenizer, then tokenize into Megatron shards and verify them",
           [py, "-m", "data_prep", "train-tokenizer", *map(str, corpus), "-o", str(tok_prefix),
            "--vocab-size", str(ns.vocab), *q])
    shards = data_dir / "shards"
    for cmd in (["tokenize", *map(str, corpus), "-o", str(shards), "-t", f"{tok_prefix}.model", "-j", "2",
                 "--shard-size", "1M", *q], ["verify", str(shards)], ["stats", str(shards), "--decode", "1"]):
        print(f"  $ {shlex.join([py, '-m', 'data_prep', *cmd])}", flush=True)
        if subprocess.run([py, "-m", "data_prep", *cmd], cwd=REPO).returncode != 0:
            raise StageFailed(f"data_prep {cmd[0]} failed")
    return shards / "manifest.json"


def _run_settings(ns, out: Path, manifest: Path, tok_info: dict) -> tuple[list[str], dict]:
    """The training overrides for this machine, and its layout (tp, pp, dp, ep, devices, device)."""
    n_dev, device = _local_devices()
    tp, pp = _layout_for(n_dev)
    overrides = [f"model.vocab_size={tok_info['vocab_size']}", f"data.manifests=[{manifest}]",
                 f"data.tokenizer={tok_info['path']}", f"checkpoint.dir={out / 'checkpoints'}",
                 f"logging.dir={out / 'logs'}", f"training.train_steps={ns.steps}",
                 f"training.eval_interval={max(1, ns.steps // 4)}",
                 f"checkpoint.save_interval={max(1, ns.steps // 2)}",
                 f"parallel.tp={tp}", f"parallel.pp={pp}", f"cluster.gpus_per_node={n_dev}"]
    dp = n_dev // (tp * pp)
    ep = 2 if ns.moe and dp % 2 == 0 else 1  # experts over 2 ranks inside DP when DP allows
    if ns.moe:
        overrides.append(f"parallel.ep={ep}")
    if device == "cuda":
        overrides += ["cluster.backend=nccl", "cluster.device=cuda", "training.precision=bf16"]
    return overrides, {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "n_dev": n_dev, "device": device}


def _plans(st: Stages, recipe_path: Path, overrides: list[str], out: Path) -> dict:
    """2. plans: this machine, and the big scenario the product exists to answer."""
    py = sys.executable
    plan_local = st.run("plan: this machine", [py, "-m", "recipes", "plan", str(recipe_path), *overrides, "--json"],
                        capture=True)
    big = st.run("plan: 130B-class model, 100 nodes x 8 A100-80GB, 10 PB corpus",
                 [py, "-m", "recipes", "plan", str(BIG_EXAMPLE), "--corpus-bytes", "10PB", "--epochs", "1",
                  "--json"], capture=True)
    plans = {"this-machine": json.loads(plan_local), "glm-130b-800xA100": json.loads(big)}
    (out / "plans").mkdir(exist_ok=True)
    for name, plan in plans.items():
        (out / "plans" / f"{name}.json").write_text(json.dumps(plan, indent=1))
    for line in plans["glm-130b-800xA100"]["explanation"]:
        print(f"  - {line}")
    return plans


def _train(st: Stages, ns, recipe_path: Path, overrides: list[str], lay: dict) -> None:
    """3. train (+ validation inside the loop) at TP x PP x DP with ZeRO-1."""
    if lay["device"] == "cuda":
        launch = ["torchrun", "--standalone", f"--nproc-per-node={lay['n_dev']}", "-m", "recipes", "train"]
    else:
        launch = [sys.executable, "-m", "recipes", "train", "--local", str(lay["n_dev"])]
    experts = f" (experts over EP={lay['ep']} inside DP)" if ns.moe else ""
    st.run(f"train: TP={lay['tp']} x PP={lay['pp']} x DP={lay['dp']}{experts} on {lay['n_dev']} {lay['device']} "
           "processes", [*launch, "--config", str(recipe_path), *(["--quiet"] if ns.quiet else []), *overrides])


def _export_and_generate(st: Stages, out: Path) -> tuple[Path, str]:
    """4. export to transformers, 5. generate with plain transformers."""
    hf_dir = out / "hf"
    # A rerun re-exports from the newest checkpoint; export_hf itself refuses a non-empty --out.
    shutil.rmtree(hf_dir, ignore_errors=True)
    st.run("export: Hugging Face transformers directory",
           [sys.executable, "-m", "recipes", "export-hf", "--checkpoint", str(out / "checkpoints"), "--out",
            str(hf_dir)])
    t0 = time.time()
    text = generate(hf_dir, PROMPT)
    st.note("generate: greedy text from the exported model", time.time() - t0)
    print(f"\n[{st.n}/{st.total}] generate: greedy text from the exported model (transformers)\n---\n{text}\n---")
    return hf_dir, text


def _report(st: Stages, out: Path, plans: dict, recipe_path: Path, overrides: list[str], text: str):
    """6. the report; the training summary."""
    from recipes.tools.report import summarize_training, read_metrics, write_report

    timings = "\n".join(f"| {t} | {s:.1f} |" for t, s in st.timings)
    report = write_report(
        out / "report", metrics=out / "logs" / "metrics.jsonl", plans=plans,
        recipe_text=recipe_path.read_text() + "\n# overrides: " + " ".join(overrides),
        extra_sections=[("Generated by the exported model", f"```\n{text}\n```"),
                        ("Stages", "| stage | seconds |\n|---|---|\n" + timings)])
    st.n += 1
    print(f"\n[{st.n}/{st.total}] report: {report}")
    return report, summarize_training(read_metrics(out / "logs" / "metrics.jsonl")[0])


def main(argv: list[str] | None = None) -> int:
    ns = _parse(argv)
    recipe_path = DEMO_MOE_RECIPE if ns.moe else DEMO_RECIPE
    out = Path(ns.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    st = Stages(total=8, quiet=ns.quiet)
    t_start = time.time()
    try:
        manifest = _data(st, ns, out / "data")
        tok_info = json.loads(manifest.read_text())["tokenizer"]
        overrides, lay = _run_settings(ns, out, manifest, tok_info)
        plans = _plans(st, recipe_path, overrides, out)
        _train(st, ns, recipe_path, overrides, lay)
        hf_dir, text = _export_and_generate(st, out)
        report, s = _report(st, out, plans, recipe_path, overrides, text)
    except StageFailed as e:
        print(f"\nmain job stopped: {e}", file=sys.stderr)
        return 1

    print(f"\nAll done in {time.time() - t_start:.0f}s. Outputs:")
    for label, path in [("corpus", out / "data" / "corpus"), ("tokenizer", tok_info["path"]),
                        ("shards + manifest", manifest), ("plans (JSON)", out / "plans"),
                        ("checkpoints", out / "checkpoints"), ("TensorBoard + metrics.jsonl", out / "logs"),
                        ("transformers model", hf_dir), ("report + plots", report)]:
        print(f"  {label:28s} {path}")
    print(f"  loss {s['first_loss']:.3f} -> {s['last_loss']:.3f} in {s['steps']} steps; "
          f"{s['median_tokens_per_s']:,.0f} tokens/s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
