"""Reshape: a checkpoint saved at TP=2 x PP=2 x DP=2 resumes at TP=1 x PP=2 x DP=2 (4 processes: TP merged, the
pipeline cut moved, half the ranks gone) and trains on as if nothing happened.

Reference: the same 2 x 2 x 2 run went on from its step-3 checkpoint to step 6 without interruption. The reshaped
run resumes from the step-3 checkpoint (weights, fp32 masters, Adam moments and step, lr schedule position,
consumed samples) and trains steps 4..6 at the new layout. The only legitimate difference is the order of
floating-point additions (TP/DP reductions over a different number of ranks): ~1e-7 relative per step, as in
tests/training's layout test, which allows 2e-5. A lost moment, a reset Adam step (bias correction), a wrong lr or
a re-read data position moves the loss by > 1e-3 at step 4 or 5.
"""
from __future__ import annotations

import pytest
import torch

from tests.support.runs import losses, pretrain
from recipes.checkpoint.format.read import read_full_state
from recipes.config.loading import RecipeError
from recipes.tools.reshape import parse_target, reshape

pytestmark = pytest.mark.multiproc

REL_TOL = 2e-5


@pytest.fixture(scope="module")
def reshaped(llama_222, tmp_path_factory):
    out = tmp_path_factory.mktemp("reshape") / "tp1_pp2_dp2"
    reshape(str(llama_222.path), str(out), llama_222.recipe(), parse_target("tp=1,pp=2,dp=2"), tag="global_step3",
            quiet=True)
    return out


def test_optimizer_state_preserved(llama_222, reshaped):
    model_cfg = llama_222.recipe().model
    before = read_full_state(llama_222.path, model_cfg, tag="global_step3", with_moments=True)
    after = read_full_state(reshaped, model_cfg, with_moments=True)
    assert after.meta["source_layout"]["tp"] == 1 and after.meta["source_layout"]["pp"] == 2
    assert after.meta["source_layout"]["dp"] == 2
    for key in ("1.self_attention.linear_qkv.weight", "4.mlp.linear_fc1.weight", "0.word_embeddings.weight"):
        for part in ("weights", "exp_avg", "exp_avg_sq"):
            a, b = getattr(before, part)[key], getattr(after, part)[key]
            for idx in [(0, 0), (5, 7), (a.shape[0] - 1, a.shape[1] - 1), (a.shape[0] // 2 + 1, 3)]:
                assert a[idx].item() == b[idx].item(), (part, key, idx)
            assert torch.equal(a, b), (part, key)
    assert before.exp_avg_sq["1.self_attention.linear_qkv.weight"].abs().sum() > 0  # real moments, not zeros
    assert after.meta["optimizer_step"] == before.meta["optimizer_step"] == 3
    assert after.meta["client_state"]["consumed_samples"] == before.meta["client_state"]["consumed_samples"]


def test_resumed_losses_continue(llama_222, reshaped):
    ref = losses(llama_222.path)
    pretrain(4, *llama_222.overrides, f"checkpoint.dir={reshaped}", "parallel.tp=1", "parallel.pp=2",
             config=llama_222.config, timeout=400)
    got = losses(reshaped)
    assert sorted(got) == [4, 5, 6], f"the reshaped run did not resume at step 4: {got}"
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in got)
    assert worst <= REL_TOL, f"losses after reshape {got} vs uninterrupted {ref} (worst rel. diff {worst:.2e})"


@pytest.mark.parametrize("target,reason", [("tp=3,pp=1,dp=1", "divisible"), ("tp=1,pp=8,dp=1", "num_layers"),
                                           ("tp=1,pp=2,dp=2,zero=2", "zero")])
def test_impossible_targets_refused(llama_222, tmp_path, target, reason):
    out = tmp_path / "never"
    with pytest.raises(RecipeError) as err:
        reshape(str(llama_222.path), str(out), llama_222.recipe(), parse_target(target), quiet=True)
    assert reason in str(err.value).lower()
    assert not out.exists() and list(tmp_path.iterdir()) == []
