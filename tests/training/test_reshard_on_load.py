"""Resume under any layout straight from `recipes train` (recipes.checkpoint.reshard): a checkpoint saved at
TP2 x PP2 x DP2 (ZeRO-1) resumes at TP1 x PP2 x DP4, TP2 x PP1 x DP4 and, on 4 ranks, TP1 x PP1 x DP4; an MoE
checkpoint saved with its experts split over EP=2 resumes at EP=1 (the experts of each EP shard read from the ranks
of its expert-data-parallel group). The following steps' losses are the uninterrupted run's within 1e-5 (sums over
other ranks round differently; the data order is the same: samples are addressed by the global consumed count), and
the source tag is only read: its files are byte-identical afterwards.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from tests.support.runs import losses, on_corpus, pretrain

pytestmark = pytest.mark.multiproc

REL_TOL = 1e-5
COMMON = ["training.train_steps=4", "checkpoint.save_interval=2", "checkpoint.keep_last=4",
          "checkpoint.async_save=false"]
MOE = ["model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.aux_loss_coeff=0.01"]


def _digests(tag: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(tag.iterdir())}


def _at_step2(source: Path, target: Path) -> dict:
    """A copy of `source` as it was after step 2 (its later tag and metrics dropped); the step-2 tag's digests."""
    shutil.copytree(source, target)
    shutil.rmtree(target / "global_step4")
    (target / "latest").write_text("global_step2")
    (target / "logs" / "metrics.jsonl").unlink()
    return _digests(target / "global_step2")


@pytest.fixture(scope="module")
def dense_source(corpus, tmp_path_factory):
    run = tmp_path_factory.mktemp("tp2pp2dp2")
    pretrain(8, *on_corpus(run, corpus), *COMMON, "parallel.tp=2", "parallel.pp=2", timeout=600)
    return run


@pytest.mark.parametrize("ranks,layout", [(8, ["parallel.tp=1", "parallel.pp=2"]),
                                          (8, ["parallel.tp=2", "parallel.pp=1"]),
                                          (4, ["parallel.tp=1", "parallel.pp=1"])],
                         ids=["tp1-pp2-dp4", "tp2-pp1-dp4", "tp1-pp1-dp4"])
def test_a_tp2_pp2_dp2_checkpoint_resumes_at_another_layout(dense_source, corpus, tmp_path, ranks, layout):
    run = tmp_path / "run"
    before = _at_step2(dense_source, run)
    out = pretrain(ranks, *on_corpus(run, corpus), *COMMON, *layout, timeout=600)
    assert "resharding it on load" in out.stdout + out.stderr
    got, ref = losses(run), losses(dense_source)
    assert sorted(got) == [3, 4]
    worst = max(abs(got[s] - ref[s]) / ref[s] for s in got)
    print(f"{layout}: worst relative loss difference vs the uninterrupted run {worst:.2e}")
    assert worst <= REL_TOL, (got, ref)
    assert _digests(run / "global_step2") == before


def test_an_expert_parallel_checkpoint_resumes_at_ep1(corpus, tmp_path):
    source = tmp_path / "ep2"
    pretrain(2, *on_corpus(source, corpus), *COMMON, *MOE, "parallel.ep=2", timeout=600)
    run = tmp_path / "ep1"
    before = _at_step2(source, run)
    out = pretrain(2, *on_corpus(run, corpus), *COMMON, *MOE, "parallel.ep=1", timeout=600)
    assert "resharding it on load" in out.stdout + out.stderr
    got, ref = losses(run), losses(source)
    assert sorted(got) == [3, 4]
    worst = max(abs(got[s] - ref[s]) / ref[s] for s in got)
    print(f"ep2 -> ep1: worst relative loss difference {worst:.2e}")
    assert worst <= REL_TOL, (got, ref)
    assert _digests(run / "global_step2") == before
