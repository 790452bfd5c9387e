"""Downstream evaluation during training (`evaluation.interval`): global rank 0 runs `python -m recipes evaluate` on
the checkpoint just saved, in a background subprocess.

Why a subprocess of rank 0 on a saved checkpoint: the model is sharded over TP x PP x DP ranks, lm-evaluation-harness
wants one transformers model, and the training ranks must not wait for it; the export path (any layout -> HF) already
exists and is tested. So the training goes on while the evaluation exports and scores; its scores are appended to
the run's metrics.jsonl and TensorBoard by the subprocess itself. One evaluation at a time: a new one first waits for
the previous one (a slow evaluation slows training instead of piling up). It runs on evaluation.device (default CPU:
on a GPU node give it a GPU the training does not use, or accept that it shares rank 0's). The checkpoint is read in
the first seconds of the evaluation; checkpoint.keep_last >= 2 keeps it on disk that long.

`evaluation.include_path` is code: lm-eval imports the .py files its task YAMLs name with `!function`. So it is taken
from the command line or from a recipe the user wrote, never from a recipe that sits in a checkpoint directory
(`check_include_path_origin`, before any rank starts); `recipes evaluate` refuses task names that shadow known ones.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from recipes.checkpoint.format.tags import tag_for  # (no torch: the include-path check stays light)
from recipes.config.loading import RecipeError, _read_mapping, resolve_preset

log = logging.getLogger(__name__)

# The rank's rendezvous variables would make the evaluation (accelerate, under lm-eval) think it is one rank of a job.
_RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
             "ROLE_RANK", "RECIPES_LOCAL_WORKER", "TORCHELASTIC_RUN_ID")


def check_include_path_origin(config: str, overrides: Sequence[str], include_path: str | None) -> None:
    """Refuse `evaluation.include_path` whose value a recipe file inside a checkpoint directory chose.

    How a checkpoint's recipe is recognised: by where it is, not by what it says. A file is inside a checkpoint
    directory when it or one of its parent directories holds checkpoint content (a `latest` file or a global_stepN
    directory), judged on the path as given and on the file a symlink points to. The value is refused when any file
    on the `extends` chain from --config to the file that sets it is such a file: the one that sets it, and every one
    that chose to extend it (a checkpoint's recipe extending a file elsewhere picked that file's value). A marker
    written into the copy would prove nothing: whoever prepared a checkpoint directory wrote that file and would leave
    the marker out. A value given on the command line (`evaluation.include_path=DIR`) is the user's own and is taken
    whatever the recipe file is."""
    if not include_path or any(o.split("=", 1)[0].strip() == "evaluation.include_path" for o in overrides):
        return
    chain = _chain_setting_include_path(config) or []
    untrusted = next((p for p in reversed(chain) if _in_checkpoint_dir(p)), None)  # the setter's own first
    if untrusted is not None:
        source = chain[-1]
        where = (", a recipe inside a checkpoint directory" if untrusted == source else
                 f", reached through {untrusted}, a recipe inside a checkpoint directory")
        raise RecipeError(
            f"evaluation.include_path = {include_path} comes from {source}{where}: "
            "a task folder is code (lm-eval imports the .py files its YAML names with !function), so it is taken "
            "only from a recipe you wrote or from the command line; if you trust that folder, pass "
            f"evaluation.include_path={include_path} as an override (or evaluation.include_path=null to drop it)")


def _chain_setting_include_path(path, seen: tuple = ()) -> list[Path] | None:
    """The files from `path` along its `extends` to the one whose value of evaluation.include_path the loaded recipe
    has (recipes.config.loading's precedence: the file itself, else the last of its extends that sets it), each as
    the chain names it (absolute, symlinks not resolved); None if none sets it."""
    given = Path(path) if Path(path).is_file() else Path(resolve_preset(str(path)))
    given = Path(os.path.abspath(given))
    real = given.resolve()
    if real in seen:
        return None
    data = _read_mapping(real)
    section = data.get("evaluation")
    if isinstance(section, dict) and "include_path" in section:
        return [given]
    parents = data.get("extends") or []
    for parent in reversed([parents] if isinstance(parents, str) else parents):
        rest = _chain_setting_include_path(resolve_preset(parent, given.parent), seen + (real,))
        if rest is not None:
            return [given] + rest
    return None


def _in_checkpoint_dir(path: Path) -> bool:
    """`path` (as given, or the file a symlink points to) lies in or under a directory holding checkpoint content."""
    for p in {Path(os.path.abspath(path)), Path(path).resolve()}:
        for folder in p.parents:
            if (folder / "latest").is_file() or any(folder.glob("global_step[0-9]*")):
                return True
    return False


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
