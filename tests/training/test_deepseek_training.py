"""DeepSeek-V3-class training on CPU ranks against the 1-process run of the same recipe: multi-head latent attention
(MLA) across TP x PP (interleaved, vpp 2) x DP with full recompute, and across TP with sequence parallelism x CP; all
with document masking (per-token RoPE positions and attention within documents reach the latent attention).

Tolerance as tests/training/test_training_layouts.py: fp32, layouts change only the order of additions (observed
~1e-7 relative), 1e-5 allowed; a down-projection summed over TP twice, a RoPE key whose gradient is not summed over
TP, or a head split in the wrong place moves the loss by far more from the first steps on.
"""
from __future__ import annotations

import pytest

from tests.support.runs import losses, on_corpus, pretrain, val_losses

pytestmark = pytest.mark.multiproc

STEPS = 6
REL_TOL = 1e-5
MLA = ["model.num_query_groups=", "model.mla.q_lora_rank=32", "model.mla.kv_lora_rank=16",
       "model.mla.qk_nope_head_dim=16", "model.mla.qk_rope_head_dim=8", "model.mla.v_head_dim=16",
       "model.document_mask=true", f"training.train_steps={STEPS}", "training.eval_interval=3"]


def _rel(a, b):
    return abs(a - b) / abs(b)


@pytest.fixture(scope="module")
def mla_reference(short_doc_corpus, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("mla_ref")
    pretrain(1, *on_corpus(run_dir, short_doc_corpus), *MLA)
    return run_dir


MLA_LAYOUTS = {
    "tp2-pp2-vpp2-dp2-recompute": (8, ["parallel.tp=2", "parallel.pp=2", "parallel.vpp=2", "parallel.recompute=full"]),
    "tp2-sp-cp2": (4, ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.cp=2"]),
}


@pytest.mark.parametrize("name", list(MLA_LAYOUTS))
def test_mla_layout_matches_single_process(name, mla_reference, short_doc_corpus, tmp_path):
    n, overrides = MLA_LAYOUTS[name]
    pretrain(n, *on_corpus(tmp_path, short_doc_corpus), *MLA, *overrides, timeout=400)
    ref, got = losses(mla_reference), losses(tmp_path)
    assert sorted(got) == list(range(1, STEPS + 1))
    worst = max(_rel(got[s], ref[s]) for s in ref)
    assert worst <= REL_TOL, f"{name}: losses {got} vs {ref} (worst relative difference {worst:.2e})"
    ref_val, got_val = val_losses(mla_reference), val_losses(tmp_path)
    assert sorted(got_val) == sorted(ref_val) == [3, 6]
    assert all(_rel(got_val[s], ref_val[s]) <= REL_TOL for s in ref_val), (got_val, ref_val)
    assert ref[STEPS] < ref[1] - 0.5  # and the model learns
