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
