"""When to save, evaluate and stop, at the end of each step: the rules only, no I/O (recipes.train.checkpoints
carries them out; tests/recipes/test_train_policy.py walks them in one process).

- Save at every checkpoint.save_interval, at the last step, on a stop, and wherever an evaluation is due (the
  evaluation reads the checkpoint of that step).
- A save waits for the one in flight first (at most one async save at a time). A stop or the last step waits for
  its own save too (the run leaves a complete checkpoint) and is written at full speed (uncapped by
  checkpoint.async_max_mib_per_s).
- An evaluation starts once its checkpoint is complete: at once for a sync save, at a later step for an async one
  (when every rank's files are durable), or when the next save finishes it first; it starts then, before that next
  save replaces it as the pending one (or prunes it).
- A stop starts no new evaluation (starting one waits without limit for the previous one) and cancels the running
  one; the job must leave within its grace period.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    save: bool = False  # save this step (finishing the save in flight first)
    capped: bool = True  # at checkpoint.async_max_mib_per_s (False: the run waits for it)
    wait: bool = False  # wait until this save is complete before going on
    evaluate: bool = False  # evaluate this step's checkpoint once it is complete
    stop: bool = False  # leave the training loop after this step


class SaveEvalStopPolicy:
    def __init__(self, total_steps: int, save_interval: int | None, eval_interval: int | None, checkpointing: bool):
        self.total_steps, self.save_interval, self.eval_interval = total_steps, save_interval, eval_interval
        self.checkpointing = checkpointing
        self.pending_eval: int | None = None  # a step whose checkpoint the evaluation waits for

    def eval_due(self, step: int) -> bool:
        """Every evaluation.interval steps and the last (every rank answers alike: these steps save, a collective)."""
        n = self.eval_interval
        return bool(n) and (step % n == 0 or step == self.total_steps)

    def decide(self, step: int, stopping: bool) -> Decision:
        """At the end of `step`; `stopping`: the ranks agreed to stop (a pre-emption signal)."""
        last = step == self.total_steps
        periodic = bool(self.save_interval) and step % self.save_interval == 0
        evaluate = self.eval_due(step) and not stopping
        save = self.checkpointing and (periodic or stopping or last or evaluate)
        if save and stopping:
            self.pending_eval = None
        return Decision(save=save, capped=not (stopping or last), wait=stopping or last, evaluate=evaluate,
                        stop=stopping)

    def finished(self, completed: int | None) -> list[int]:
        """Before a new save, the save in flight finished: `completed` is the newest complete step (that save's, or
        the one poll() completed at this step; None if none): the evaluations to start now, before the new save
        replaces the pending one."""
        if self.pending_eval is not None and completed == self.pending_eval:
            self.pending_eval = None
            return [completed]
        return []

    def step_done(self, step: int, decision: Decision, completed: int | None) -> list[int]:
        """After this step's saving (`completed`: the newest step whose save is complete): the evaluations to start."""
        if decision.evaluate:
            self.pending_eval = step
        if self.pending_eval is not None and completed == self.pending_eval:
            self.pending_eval = None
            return [completed]
        return []
