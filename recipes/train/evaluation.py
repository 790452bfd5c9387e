"""Downstream evaluation during training (`evaluation.interval`): global rank 0 runs `python -m recipes evaluate` on
the checkpoint just saved, in a background subprocess.

Why a subprocess of rank 0 on a saved checkpoint: the model is sharded over TP x PP x DP ranks, lm-evaluation-harness
wants one transformers model, and the training ranks must not wait for it; the export path (any layout -> HF) already
exists and is tested. So the training goes on while the evaluation exports and scores; its scores are appended to
the run's metrics.jsonl and TensorBoard by the subprocess itself. One evaluation at a time: a new one first waits for
the previous one (a slow evaluation slows training instead of piling up). It runs on evaluation.device (default CPU:
on a GPU node give it a GPU the training does not use, or accept that it shares rank 0's). The checkpoint is read in
the first seconds of the evaluation; checkpoint.keep_last >= 2 keeps it on disk that long.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from recipes.checkpoint.format.tags import tag_for

log = logging.getLogger(__name__)

# The rank's rendezvous variables would make the evaluation (accelerate, under lm-eval) think it is one rank of a job.
_RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
             "ROLE_RANK", "RECIPES_LOCAL_WORKER", "TORCHELASTIC_RUN_ID")


class BackgroundEval:
    def __init__(self, recipe, ckpt_dir: str | None, log_dir: Path, enabled: bool):
        self.cfg = recipe.evaluation
        self.enabled = bool(enabled and self.cfg.interval and ckpt_dir)
        self.ckpt_dir, self.log_dir = ckpt_dir, log_dir
        self.tensorboard = recipe.logging.tensorboard
        self.proc: subprocess.Popen | None = None
        self.step = None

    def command(self, step: int) -> list[str]:
        c = self.cfg
        cmd = [sys.executable, "-m", "recipes", "evaluate", "--checkpoint", str(self.ckpt_dir), "--tag",
               tag_for(step), "--step", str(step), "--log-metrics", str(self.log_dir / "metrics.jsonl"),
               "--tasks", ",".join(c.tasks), "--device", c.device, "--batch-size", str(c.batch_size), "--dtype", c.dtype, "--quiet"]
        if self.tensorboard:
            cmd += ["--tensorboard", str(self.log_dir / "tensorboard")]
        for flag, value in (("--limit", c.limit), ("--include-path", c.include_path), ("--text", c.text)):
            if value is not None:
                cmd += [flag, str(value)]
        return cmd

    def start(self, step: int) -> None:
        if not self.enabled:
            return
        self.wait()
        env = {k: v for k, v in os.environ.items() if k not in _RANK_ENV}
        if self.cfg.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        out = self.log_dir / f"evaluate_step{step}.log"
        with open(out, "w") as f:
            self.proc = subprocess.Popen(self.command(step), stdout=f, stderr=subprocess.STDOUT, env=env)
        self.step = step
        log.info(f"evaluation of step {step} started in the background (pid {self.proc.pid}, log {out})")

    def wait(self) -> None:
        if self.proc is None:
            return
        code = self.proc.wait()
        if code:
            log.warning(f"evaluation of step {self.step} failed (exit {code}); see "
                        f"{self.log_dir / f'evaluate_step{self.step}.log'}")
        self.proc = None

    def cancel(self) -> None:
        """Pre-emption: the job must leave within its grace period; this evaluation's scores are lost."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            log.info(f"evaluation of step {self.step} stopped with the run; rerun it with: python -m recipes evaluate "
                     f"--checkpoint {self.ckpt_dir} --tag {tag_for(self.step)} --step {self.step} --log-metrics "
                     f"{self.log_dir / 'metrics.jsonl'}")
        self.proc = None
