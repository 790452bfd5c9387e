"""The measurements of `run.sh`, in one time budget: tests/gpu, bench_train at 2-3 micro-batch sizes, the megatron-core
vs plain PyTorch step-time comparison, the pipeline schedules (1F1B, interleaved, zero-bubble: step time and measured
bubble, with 2 GPUs); one JSON + a log + a torch.profiler summary in OUTDIR.

    python launch/gpu_check/gpu_check.py OUTDIR [--budget-s 480] [--dry]

--dry runs the same stages on CPU with the tiny recipe and two steps: it proves every import and code path resolves
(run.sh --dry runs it in a clean venv that sees only torch and the wheel folder), not any figure.
Every stage runs in its own process with a timeout cut from what is left of the budget, so a slow or hung stage
costs its share and the JSON is still written.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPU_RECIPE = "configs/runs/bench-gpt-1.3b-1gpu.yaml"
PEAK_BF16_TFLOPS = 989.0  # H100/H200 SXM dense bf16 (vendor datasheet); the cluster preset says the same


class Stages:
    def __init__(self, out: Path, budget_s: float):
        self.out, self.deadline, self.t0 = out, time.monotonic() + budget_s, time.monotonic()
        self.log = open(out / "run.log", "a")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, text: str) -> None:
        line = f"[gpu_check +{time.monotonic() - self.t0:5.0f}s] {text}"
        print(line, flush=True)
        if not os.environ.get("GPU_CHECK_LOG_TEED"):  # run.sh tees stdout into run.log already
            self.log.write(line + "\n")
            self.log.flush()

    def run(self, name: str, cmd: list[str], cap_s: float, reserve_s: float = 0.0) -> dict:
        """Run one stage; its output goes to the log. Timeout = min(cap, what is left minus what later stages need)."""
        timeout = min(cap_s, self.left() - reserve_s)
        if timeout < 20:
            self.say(f"{name}: skipped, {self.left():.0f} s of the budget left")
            return {"status": "skipped (budget)", "seconds": 0.0}
        self.say(f"{name}: {' '.join(cmd)} (timeout {timeout:.0f} s)")
        t = time.monotonic()
        self.log.write(f"----- {name} -----\n")
        self.log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            rc = subprocess.run(cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, timeout=timeout,
                                env=env).returncode
            status = "ok" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {timeout:.0f} s"
        took = time.monotonic() - t
        self.say(f"{name}: {status} in {took:.0f} s")
        return {"status": status, "seconds": round(took, 1)}


def environment() -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_gb"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("deepspeed", "megatron-core", "pydantic", "numpy"):
        try:
            env[dist] = version(dist)
        except PackageNotFoundError:
            env[dist] = None
    return env


def pytest_counts(log_text: str) -> str:
    """pytest's closing summary line of the tests/gpu stage (e.g. '4 passed, 1 skipped in 80.1s')."""
    lines = [x for x in log_text.splitlines() if (" passed" in x or " failed" in x or " skipped" in x) and " in " in x]
    return lines[-1].strip("= ") if lines else ""


def pipeline_schedules(st: Stages, py: str, out: Path, dry: bool) -> dict:
    """1F1B, interleaved 1F1B and zero-bubble on 2 pipeline ranks: the step time and the measured bubble of each
    (metrics.jsonl's step_time_s / pp_bubble / pp_bubble_predicted, recipes.parallel.pipeline). Two devices are
    needed: on a machine with one GPU the stage says so instead of running (NCCL refuses two ranks on one GPU)."""
    import torch

    gpus = torch.cuda.device_count()
    if not dry and gpus < 2:
        st.say(f"pipeline schedules: not run: a pipeline needs 2 GPUs, this machine has {gpus}")
        return {"status": "ok", "seconds": 0.0, "note": f"not run: {gpus} GPU (a pipeline needs 2)"}
    recipe, steps = ("configs/runs/tiny-cpu.yaml", 3) if dry else (GPU_RECIPE, 8)
    start = [py, "-m", "recipes", "train", "--config", recipe, "--local", "2"] if dry else \
        [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "recipes", "train",
         "--config", recipe]
    data = [f"data.manifests=[{synthetic_shards(out / 'pipeline_data', vocab=300 if dry else 50000)}]"]
    runs, total = {}, {"status": "ok", "seconds": 0.0}
    schedules = (("1f1b", []), ("interleaved_1f1b", ["parallel.vpp=2"]),
                 ("zero_bubble", ["parallel.vpp=2", "parallel.pipeline_schedule=zero_bubble"]))
    # --dry: zero-bubble alone, which takes the interleaved path too (vpp 2); the other two differ only in the
    # schedule class torch.distributed.pipelining picks, and each run costs ~8 s of CPU in the test suite
    for name, extra in schedules[2:] if dry else schedules:
        ckpt = out / f"pipeline_{name}"
        stage = st.run(f"pipeline {name}", [*start, "--quiet", *data, "parallel.pp=2", *extra,
                                            f"training.train_steps={steps}", f"checkpoint.dir={ckpt}",
                                            "training.global_batch=16", "logging.tensorboard=false"]
                         + ([] if dry else ["parallel.micro_batch=2"]),
                         cap_s=150)
        total["seconds"] += stage["seconds"]
        if stage["status"] != "ok":
            total["status"] = stage["status"]
        records = [json.loads(x) for x in (ckpt / "logs" / "metrics.jsonl").read_text().splitlines()] \
            if (ckpt / "logs" / "metrics.jsonl").is_file() else []
        last = [r for r in records if "pp_bubble" in r][-1:] or [{}]
        runs[name] = {k: last[0].get(k) for k in ("step_time_s", "tokens_per_s", "pp_bubble", "pp_bubble_predicted")}
    total["runs"] = runs
    return total


def synthetic_shards(out: Path, vocab: int, tokens: int = 600_000) -> Path:
    """Random-token shards and their manifest (megatron-core's own writer; the GPU image has no tokenizer): what a
    training run reads, for timing the step, not for learning anything."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    builder = IndexedDatasetBuilder(str(out / "shard_000.bin"), dtype=np.uint16)
    for _ in range(tokens // 1000):
        builder.add_document(rng.integers(0, vocab - 1, 1000).astype(np.int64), [1000])
    builder.finalize(str(out / "shard_000.idx"))
    manifest = {"tokenizer": {"vocab_size": vocab, "eod_id": vocab - 1, "pad_id": None, "type": "synthetic",
                              "path": None}, "dtype": "uint16",
                "shards": [{"prefix": "shard_000", "tokens": tokens}], "blend": [tokens, "shard_000"]}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out / "manifest.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--dry", action="store_true", help="CPU, tiny recipe, two steps: checks the path, measures nothing")
    ns = ap.parse_args(argv)
    out = Path(ns.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    st = Stages(out, ns.budget_s)
    result = {"dry": ns.dry, "environment": environment(), "stages": {}, "bench": [], "peak_tflops": PEAK_BF16_TFLOPS}
    st.say(f"environment: {result['environment']}")
    run_stages(st, result, out, ns.dry)
    summarise(result)
    result["seconds"] = round(time.monotonic() - st.t0, 1)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    st.say(f"wrote {out / 'gpu_check.json'}" + (f"; best: {result['best']}" if "best" in result else ""))
    failed = [k for k, v in result["stages"].items() if v["status"] != "ok"]
    if failed:
        st.say(f"stages not ok: {', '.join(failed)} (see run.log)")
    return 1 if failed else 0


def run_stages(st: Stages, result: dict, out: Path, dry: bool) -> None:
    py = sys.executable
    if dry:
        # one micro-batch: the stages' code paths are the same for each (profiled as the last), and every bench
        # stage is a process paying torch's, DeepSpeed's and megatron-core's imports again (~8 s of CPU)
        recipe, mbs, steps, warmup = "configs/runs/tiny-cpu.yaml", (2,), 2, 1
        extra = ["training.global_batch=8"]
    else:
        # 1.3B GPT (GPT-3 XL shape), bf16, seq 2048, one GPU, ZeRO-1, no TP/PP; 32 sequences per step.
        recipe, mbs, steps, warmup = GPU_RECIPE, (4, 8, 16), 8, 2
        extra = ["training.global_batch=32", "parallel.zero_stage=1"]
    tests_gpu(st, result, out, py)
    for i, mb in enumerate(mbs):  # bench_train at 2-3 micro-batch sizes; the largest is profiled
        js = out / f"bench_mb{mb}.json"
        cmd = [py, "-m", "recipes", "bench", "train", "--gpu", "--config", recipe, "--steps", str(steps),
               "--warmup", str(warmup), "--json", str(js), f"parallel.micro_batch={mb}", *extra]
        if i == len(mbs) - 1:
            cmd += ["--profile", str(out / "profile.txt")]
        result["stages"][f"bench_mb{mb}"] = st.run(f"bench micro-batch {mb}", cmd, cap_s=150,
                                                   reserve_s=40 * (len(mbs) - i) + 60)
        if js.is_file():
            result["bench"].append(json.loads(js.read_text()))
    mid = mbs[len(mbs) // 2]
    compare(st, result, out, py, recipe, mid, steps, warmup, extra, dry)
    result["stages"]["pipeline"] = pipeline_schedules(st, py, out, dry)


def tests_gpu(st: Stages, result: dict, out: Path, py: str) -> None:
    """tests/gpu (skipped without CUDA; under --dry this proves they import and collect)."""
    log_start = (out / "run.log").stat().st_size
    result["stages"]["tests_gpu"] = st.run("tests/gpu", [py, "-m", "pytest", "-q", "-x", "tests/gpu"],
                                           cap_s=200, reserve_s=300)
    with open(out / "run.log") as f:
        f.seek(log_start)
        result["stages"]["tests_gpu"]["summary"] = pytest_counts(f.read())


def compare(st: Stages, result: dict, out: Path, py: str, recipe: str, mid: int, steps: int, warmup: int,
            extra: list[str], dry: bool) -> None:
    """The megatron-core model vs plain PyTorch of the same shape at the middle micro-batch, and (not under --dry:
    compiling on CPU takes minutes and proves nothing about the GPU's kernels) the opt-in torch.compile."""
    js = out / "compare.json"
    result["stages"]["compare"] = st.run(
        "megatron-core vs plain PyTorch", [py, "-m", "recipes", "bench", "plain", "--config", recipe, "--steps",
                                           str(steps if dry else 5), "--warmup", str(warmup), "--json", str(js),
                                           f"parallel.micro_batch={mid}", *extra], cap_s=150, reserve_s=60)
    if js.is_file():
        result["compare"] = json.loads(js.read_text())
    js = out / f"bench_mb{mid}_compiled.json"
    if dry:
        result["stages"]["bench_compiled"] = {"status": "ok", "seconds": 0.0, "note": "not run under --dry"}
        return
    result["stages"]["bench_compiled"] = st.run(
        f"bench micro-batch {mid}, training.compile_decoder_layers=true",
        [py, "-m", "recipes", "bench", "train", "--gpu", "--config", recipe, "--steps", str(steps), "--warmup",
         str(warmup + 1), "--json", str(js), f"parallel.micro_batch={mid}", "training.compile_decoder_layers=true",
         *extra], cap_s=150, reserve_s=60)
    if js.is_file():
        result["bench_compiled"] = json.loads(js.read_text())


def summarise(result: dict) -> None:
    if result["bench"]:
        best = max(result["bench"], key=lambda r: r["tokens_per_s"])
        result["best"] = {k: best.get(k) for k in (
            "micro_batch", "tokens_per_s", "tflops_per_gpu", "step_time_s", "predicted_step_time_s",
            "step_time_vs_predicted", "max_memory_reserved_gb", "predicted_memory_gb", "memory_vs_predicted",
            "attention")}
        result["best"]["mfu_vs_989"] = best["tflops_per_gpu"] / PEAK_BF16_TFLOPS


if __name__ == "__main__":
    raise SystemExit(main())
