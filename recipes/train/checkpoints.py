"""The run's checkpoints and background evaluations at each step's end, as recipes.train.policy decides: the saver
(recipes.checkpoint.store.Checkpointer, sync or async), the evaluation subprocess of rank 0
(recipes.train.evaluation), the lease check before every save. Collective: every rank calls `after_step` alike."""
from __future__ import annotations

import logging

from recipes.checkpoint.format import layout_record
from recipes.checkpoint.store import Checkpointer
from recipes.train.policy import SaveEvalStopPolicy

logger = logging.getLogger(__name__)


class RunCheckpoints:
    def __init__(self, recipe, eng, device, total_steps: int, evaluation, lease, heartbeat):
        c = recipe.checkpoint
        self.saver = Checkpointer(eng.engine, c.dir, c.keep_last, background=c.async_save, device=device,
                                  max_mib_per_s=c.async_max_mib_per_s,
                                  record=layout_record.record(recipe, eng.layout)) if c.dir else None
        self.policy = SaveEvalStopPolicy(total_steps, c.save_interval, recipe.evaluation.interval,
                                         checkpointing=bool(c.dir))
        self.evaluation, self.lease, self.heartbeat = evaluation, lease, heartbeat

    def after_step(self, step: int, client_state: dict, stopping: bool) -> bool:
        """Save / evaluate as the policy says; True when the run stops now."""
        if self.saver:
            self.saver.poll()  # an async save from an earlier step: complete once every rank's files are durable
        decision = self.policy.decide(step, stopping)
        if decision.save:
            self.saver.finish()
            # the newest complete save: the one in flight just now, or one poll() completed at this very step
            self._evaluate(self.policy.finished(self.saver.completed))
            self._save(step, client_state, capped=decision.capped)
            if decision.wait:
                self.saver.finish()  # a stop or the end waits for the disk: the run leaves a complete checkpoint
        self._evaluate(self.policy.step_done(step, decision, self.saver.completed if self.saver else None))
        if decision.stop:
            self.evaluation.cancel()
        return decision.stop

    def save_now(self, step: int, client_state: dict) -> None:
        """Collective: a checkpoint of `step` outside the policy, complete when this returns (the starting point of a
        run initialised from another's checkpoint); nothing without checkpoint.dir."""
        if self.saver:
            self._save(step, client_state, capped=False)
            self.saver.finish()

    def _save(self, step: int, client_state: dict, capped: bool) -> None:
        if self.lease:
            self.lease.check()
        self.heartbeat.beat(step, "save")
        self.saver.save(step, client_state, capped=capped)

    def _evaluate(self, steps: list[int]) -> None:
        for s in steps:
            self.evaluation.start(s)

    def close(self) -> None:
        """Collective: the save in flight completes; the writer process and shared-memory arena go now, not at
        interpreter exit."""
        if self.saver:
            self.saver.close()

    def abandon(self) -> None:
        """Not collective, for an error path: stop the writer now (no save completed; the ranks may not all be
        here); a no-op after close()."""
        if self.saver:
            self.saver.abandon()
