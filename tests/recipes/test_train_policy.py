"""The save / evaluate / stop rules of the trainer (recipes.train.policy), walked step by step in one process. Each
scenario feeds the facts a real Checkpointer would report (which save a `finish()` completed, the newest complete
step after the step's saving) and checks the decisions and the evaluations started, against the timeline written
out by hand from the rules in the policy's docstring."""
from __future__ import annotations

import pytest

from recipes.train.policy import Decision, SaveEvalStopPolicy

pytestmark = pytest.mark.unit


def test_saves_at_the_interval_and_at_the_last_step_which_waits_uncapped():
    p = SaveEvalStopPolicy(total_steps=5, save_interval=2, eval_interval=None, checkpointing=True)
    got = {s: p.decide(s, stopping=False) for s in range(1, 6)}
    assert [s for s, d in got.items() if d.save] == [2, 4, 5]
    assert got[2] == Decision(save=True, capped=True, wait=False)
    assert got[5] == Decision(save=True, capped=False, wait=True)  # the end waits for the disk, at full speed
    assert not any(d.stop or d.evaluate for d in got.values())


def test_sync_save_evaluates_at_once():
    p = SaveEvalStopPolicy(total_steps=10, save_interval=None, eval_interval=4, checkpointing=True)
    d = p.decide(4, stopping=False)
    assert d.save and d.evaluate and not d.wait
    assert p.finished(None) == []  # nothing was in flight
    assert p.step_done(4, d, completed=4) == [4]  # a sync save is complete when save() returns
    assert p.pending_eval is None


def test_async_save_evaluates_when_a_later_step_finds_it_complete():
    p = SaveEvalStopPolicy(total_steps=10, save_interval=None, eval_interval=4, checkpointing=True)
    d = p.decide(4, stopping=False)
    assert p.finished(None) == [] and p.step_done(4, d, completed=None) == []  # still being written
    assert p.pending_eval == 4
    d5 = p.decide(5, stopping=False)
    assert not d5.save
    assert p.step_done(5, d5, completed=None) == []  # poll() at step 5: not durable yet
    assert p.step_done(6, p.decide(6, stopping=False), completed=4) == [4]  # poll() at step 6 completed it
    assert p.pending_eval is None


def test_the_next_save_finishes_the_pending_one_and_starts_its_evaluation_first():
    p = SaveEvalStopPolicy(total_steps=10, save_interval=None, eval_interval=2, checkpointing=True)
    p.step_done(2, p.decide(2, stopping=False), completed=None)  # async save of step 2, in flight
    p.step_done(3, p.decide(3, stopping=False), completed=None)
    d4 = p.decide(4, stopping=False)
    assert d4.save and d4.evaluate
    assert p.finished(2) == [2]  # finish() before step 4's save completed step 2: evaluate it before step 4's save
    assert p.step_done(4, d4, completed=2) == []  # step 4 now waits for its own save
    assert p.pending_eval == 4


def test_a_pending_evaluation_completed_by_poll_at_a_saving_step_still_starts():
    """Seen under load: step 3's async save became durable exactly at step 6 (found by poll() before step 6's own
    save); it must still be evaluated, before step 6 becomes the pending evaluation."""
    p = SaveEvalStopPolicy(total_steps=6, save_interval=None, eval_interval=3, checkpointing=True)
    p.step_done(3, p.decide(3, stopping=False), completed=None)  # step 3's save in flight
    for s in (4, 5):
        assert p.step_done(s, p.decide(s, stopping=False), completed=None) == []
    d6 = p.decide(6, stopping=False)
    assert d6.save and d6.evaluate
    assert p.finished(3) == [3]  # the newest complete step is 3: evaluate it now
    assert p.step_done(6, d6, completed=6) == [6]


def test_last_step_is_evaluated_after_its_waited_save():
    p = SaveEvalStopPolicy(total_steps=6, save_interval=None, eval_interval=4, checkpointing=True)
    assert [s for s in range(1, 7) if p.eval_due(s)] == [4, 6]
    d = p.decide(6, stopping=False)
    assert d == Decision(save=True, capped=False, wait=True, evaluate=True)
    assert p.finished(None) == [] and p.step_done(6, d, completed=6) == [6]


def test_a_stop_saves_waits_and_starts_no_evaluation():
    p = SaveEvalStopPolicy(total_steps=10, save_interval=5, eval_interval=2, checkpointing=True)
    p.step_done(2, p.decide(2, stopping=False), completed=None)  # evaluation of step 2 waits for its async save
    d = p.decide(3, stopping=True)
    assert d == Decision(save=True, capped=False, wait=True, evaluate=False, stop=True)
    assert p.finished(2) == []  # step 2's save completes, but a stop starts no new evaluation
    assert p.step_done(3, d, completed=3) == [] and p.pending_eval is None


def test_without_a_checkpoint_dir_nothing_is_saved_but_a_stop_still_stops():
    p = SaveEvalStopPolicy(total_steps=4, save_interval=2, eval_interval=None, checkpointing=False)
    assert not any(p.decide(s, stopping=False).save for s in range(1, 5))
    assert p.decide(2, stopping=True) == Decision(save=False, capped=False, wait=True, stop=True)


class _AsyncSaver:
    """Checkpointer's step-boundary protocol, in memory: an async save becomes durable when `durable_at` says."""

    def __init__(self, durable_at: dict[int, int]):
        self.durable_at, self.inflight, self.completed = durable_at, None, None

    def poll(self, now: int):
        if self.inflight is not None and self.durable_at[self.inflight] <= now:
            self.completed, self.inflight = self.inflight, None

    def finish(self):
        done, self.inflight = self.inflight, None
        if done is not None:
            self.completed = done
        return done

    def save(self, step, client_state, capped=True):
        self.finish()
        self.inflight = step


def test_checkpoints_glue_starts_the_evaluation_poll_completed_at_a_saving_step():
    """recipes.train.checkpoints.RunCheckpoints.after_step, with the save's durability timed as under load: step 3's
    save is found complete by poll() at step 6, which saves too. Both evaluations start, 3 before 6."""
    from types import SimpleNamespace

    from recipes.train.checkpoints import RunCheckpoints

    saver, started = _AsyncSaver({3: 6, 6: 6}), []
    ckpt = RunCheckpoints.__new__(RunCheckpoints)
    ckpt.saver, ckpt.lease = saver, None
    ckpt.policy = SaveEvalStopPolicy(total_steps=6, save_interval=None, eval_interval=3, checkpointing=True)
    ckpt.evaluation = SimpleNamespace(start=started.append, cancel=lambda: None)
    ckpt.heartbeat = SimpleNamespace(beat=lambda *a: None)
    for step in range(1, 7):
        real_poll = saver.poll
        saver.poll = lambda: real_poll(step)
        ckpt.after_step(step, {}, stopping=False)
        saver.poll = real_poll
    assert started == [3, 6]
