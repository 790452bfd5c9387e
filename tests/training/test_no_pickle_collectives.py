"""No pickle crosses a collective: torch's *_object collectives (broadcast_object_list, all_gather_object, ...) unpickle
whatever arrives on an unauthenticated rendezvous. Every process of these runs starts with torch's object
serialisation for collectives made to fail (a sitecustomize.py on PYTHONPATH replaces
distributed_c10d._object_to_tensor / _tensor_to_object and its pickler / unpickler), and a PP=2 x DP=2 run still
trains, saves, and resumes from its checkpoint."""
from __future__ import annotations

import subprocess

import pytest

from tests.support.runs import REPO, losses, on_corpus, pretrain_cmd, worker_env

pytestmark = pytest.mark.multiproc

HOOK = '''
import os
import pathlib

from torch.distributed import distributed_c10d as c10d


def _refuse(*args, **kwargs):
    raise RuntimeError("NO-PICKLE: a pickled object was about to cross a collective")


class _Refused:
    def __init__(self, *args, **kwargs):
        _refuse()


c10d._object_to_tensor = c10d._tensor_to_object = _refuse
c10d._pickler = c10d._unpickler = _Refused


def _mark():  # this process runs with the hook: a fresh interpreter, or a fork of one that did (it inherits it)
    pathlib.Path(os.environ["NO_PICKLE_MARKS"], str(os.getpid())).touch()


_mark()
os.register_at_fork(after_in_child=_mark)
'''
LAYOUT = ["parallel.pp=2", "parallel.zero_stage=1", "checkpoint.save_interval=2", "training.global_batch=8"]


def _run(tmp_path, corpus, steps: int, env: dict) -> subprocess.CompletedProcess:
    cmd = pretrain_cmd(4, *on_corpus(tmp_path / "run", corpus), f"training.train_steps={steps}", *LAYOUT)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)


def test_training_save_and_resume_without_pickled_collectives(corpus, tmp_path):
    hooks, marks = tmp_path / "hooks", tmp_path / "marks"
    hooks.mkdir()
    marks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOOK)
    env = dict(worker_env(), PYTHONPATH=str(hooks), NO_PICKLE_MARKS=str(marks))

    first = _run(tmp_path, corpus, 4, env)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "NO-PICKLE" not in first.stdout + first.stderr
    assert len(list(marks.iterdir())) >= 5  # the launcher and its 4 ranks (forked from it, or fresh) had the hook
    assert (tmp_path / "run" / "global_step4" / "complete.json").is_file()

    second = _run(tmp_path, corpus, 6, env)  # resumes: every rank agrees on the tag to load
    out = second.stdout + second.stderr
    assert second.returncode == 0, second.stderr[-4000:]
    assert f"resumed from {tmp_path / 'run' / 'global_step4'}" in out, out[-3000:]
    assert sorted(losses(tmp_path / "run")) == list(range(1, 7))
