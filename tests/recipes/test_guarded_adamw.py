"""GuardedAdamW (recipes/train/engine.py) is torch's AdamW, step for step, plus a skip on a non-finite gradient: what
its docstring promises, checked against torch.optim.AdamW and torch.optim.Adam run beside it on the same gradients."""
from __future__ import annotations

import copy

import pytest
import torch

from recipes.train.engine import GuardedAdamW

pytestmark = pytest.mark.unit

HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))


def _groups(model, weight_decay):
    """The engine's grouping: decay on matrices, none on norms and biases."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def _set_grads(models, step, bad=False):
    g = torch.Generator().manual_seed(100 + step)
    for params in zip(*(m.parameters() for m in models), strict=True):
        grad = torch.randn(params[0].shape, generator=g)
        if bad:
            grad.view(-1)[0] = float("nan")
        for p in params:
            p.grad = grad.clone()


def _assert_same(a, b):
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("reference,weight_decay", [(torch.optim.AdamW, 0.1), (torch.optim.Adam, 0.0)])
def test_steps_are_torchs_own_bit_for_bit(reference, weight_decay):
    ours, theirs = _model(), _model()
    opt = GuardedAdamW(_groups(ours, weight_decay), **HYPER)
    ref = reference(_groups(theirs, weight_decay), **HYPER)
    initial = copy.deepcopy(ours)
    for step in range(5):
        _set_grads([ours, theirs], step)
        opt.step()
        ref.step()
        assert not opt.last_skipped
        _assert_same(ours, theirs)
    assert not any(torch.equal(a, b) for a, b in zip(ours.parameters(), initial.parameters(), strict=True))
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):  # the moments and the step count too
        assert all(torch.equal(opt.state[p][k], ref.state[q][k]) for k in ("step", "exp_avg", "exp_avg_sq"))


def test_a_non_finite_gradient_skips_the_step_and_leaves_no_trace():
    """A NaN gradient: nothing changes (weights, moments, step count); the steps after it are those of an AdamW that
    never saw it."""
    ours, theirs = _model(), _model()
    opt = GuardedAdamW(_groups(ours, 0.1), **HYPER)
    ref = torch.optim.AdamW(_groups(theirs, 0.1), **HYPER)
    _set_grads([ours, theirs], 0)
    opt.step()
    ref.step()
    before = copy.deepcopy(ours)
    moments = {k: v["exp_avg"].clone() for k, v in opt.state.items()}
    _set_grads([ours], 1, bad=True)
    assert opt.step() is None and opt.last_skipped
    _assert_same(ours, before)
    assert all(torch.equal(opt.state[p]["exp_avg"], moments[p]) and int(opt.state[p]["step"]) == 1 for p in moments)
    for step in (2, 3):
        _set_grads([ours, theirs], step)
        opt.step()
        ref.step()
        assert not opt.last_skipped
    _assert_same(ours, theirs)


def test_without_the_check_a_non_finite_gradient_reaches_adamw():
    """check_finite off (ZeRO-1/2, whose optimizer checks the global grad norm itself): plain AdamW, NaN included."""
    model = _model()
    opt = GuardedAdamW(_groups(model, 0.1), **HYPER)
    opt.check_finite = False
    _set_grads([model], 0, bad=True)
    opt.step()
    assert not opt.last_skipped and torch.isnan(next(model.parameters())).any()
