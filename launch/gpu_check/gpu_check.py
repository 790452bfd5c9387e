"""The measurements of `run.sh`, in one time budget: tests/gpu, bench_train at 2-3 micro-batch sizes, the megatron-core
vs plain PyTorch step-time comparison; one JSON + a log + a torch.profiler summary in OUTDIR.

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--dry", action="store_true", help="CPU, tiny recipe, two steps: checks the path, measures nothing")
    ns = ap.parse_args(argv)
    out = Path(ns.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    st = Stages(out, ns.budget_s)
    py = sys.executable
    result = {"dry": ns.dry, "environment": environment(), "stages": {}, "bench": [], "peak_tflops": PEAK_BF16_TFLOPS}
    st.say(f"environment: {result['environment']}")

    if ns.dry:
        # one micro-batch: the stages' code paths are the same for each (profiled as the last), and every bench
        # stage is a process paying torch's, DeepSpeed's and megatron-core's imports again (~8 s of CPU)
        recipe, mbs, steps, warmup = "configs/runs/tiny-cpu.yaml", (2,), 2, 1
        extra = ["training.global_batch=8"]
    else:
        # 1.3B GPT (GPT-3 XL shape), bf16, seq 2048, one GPU, ZeRO-1, no TP/PP; 32 sequences per step.
        recipe, mbs, steps, warmup = GPU_RECIPE, (4, 8, 16), 8, 2
        extra = ["training.global_batch=32", "parallel.zero_stage=1"]

    # 1. tests/gpu (skipped without CUDA; under --dry this proves they import and collect)
    log_start = (out / "run.log").stat().st_size
    result["stages"]["tests_gpu"] = st.run("tests/gpu", [py, "-m", "pytest", "-q", "-x", "tests/gpu"],
                                           cap_s=200, reserve_s=240)
    with open(out / "run.log") as f:
        f.seek(log_start)
        result["stages"]["tests_gpu"]["summary"] = pytest_counts(f.read())

    # 2. bench_train at 2-3 micro-batch sizes; the largest is profiled.
    for i, mb in enumerate(mbs):
        js = out / f"bench_mb{mb}.json"
        cmd = [py, "-m", "recipes", "bench-train", "--gpu", "--config", recipe, "--steps", str(steps),
               "--warmup", str(warmup), "--json", str(js), f"parallel.micro_batch={mb}", *extra]
        if i == len(mbs) - 1:
            cmd += ["--profile", str(out / "profile.txt")]
        stage = st.run(f"bench micro-batch {mb}", cmd, cap_s=150, reserve_s=40 * (len(mbs) - i))
        result["stages"][f"bench_mb{mb}"] = stage
        if js.is_file():
            result["bench"].append(json.loads(js.read_text()))

    mid = mbs[len(mbs) // 2]  # the middle micro-batch: compared with plain PyTorch, and compiled
    # 3. TP=1 megatron-core model vs plain PyTorch model of the same shape
    js = out / "compare.json"
    result["stages"]["compare"] = st.run(
        "megatron-core vs plain PyTorch", [py, "-m", "recipes", "bench-plain", "--config", recipe, "--steps",
                                           str(steps if ns.dry else 5), "--warmup", str(warmup), "--json", str(js),
                                           f"parallel.micro_batch={mid}", *extra], cap_s=150)
    if js.is_file():
        result["compare"] = json.loads(js.read_text())

    # 4. opt-in torch.compile of the decoder layers at the middle micro-batch, if time is left (default stays off
    #    unless this measures faster)
    js = out / f"bench_mb{mid}_compiled.json"
    if ns.dry:  # compiling on CPU takes minutes and proves nothing about the GPU's kernels
        result["stages"]["bench_compiled"] = {"status": "ok", "seconds": 0.0, "note": "not run under --dry"}
    else:
        result["stages"]["bench_compiled"] = st.run(
            f"bench micro-batch {mid}, training.compile_decoder_layers=true",
            [py, "-m", "recipes", "bench-train", "--gpu", "--config", recipe, "--steps", str(steps), "--warmup",
             str(warmup + 1), "--json", str(js), f"parallel.micro_batch={mid}",
             "training.compile_decoder_layers=true", *extra], cap_s=150)
    if js.is_file():
        result["bench_compiled"] = json.loads(js.read_text())

    if result["bench"]:
        best = max(result["bench"], key=lambda r: r["tokens_per_s"])
        result["best"] = {k: best.get(k) for k in (
            "micro_batch", "tokens_per_s", "tflops_per_gpu", "step_time_s", "predicted_step_time_s",
            "step_time_vs_predicted", "max_memory_reserved_gb", "predicted_memory_gb", "memory_vs_predicted",
            "attention")}
        result["best"]["mfu_vs_989"] = best["tflops_per_gpu"] / PEAK_BF16_TFLOPS
    result["seconds"] = round(time.monotonic() - st.t0, 1)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    st.say(f"wrote {out / 'gpu_check.json'}" + (f"; best: {result['best']}" if "best" in result else ""))
    failed = [k for k, v in result["stages"].items() if v["status"] != "ok"]
    if failed:
        st.say(f"stages not ok: {', '.join(failed)} (see run.log)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
