"""data.num_workers: DataLoader workers give exactly the micro-batches the in-process path gives, step after step, after
a jump (a resume at another consumed count) and for another DP rank; with position ids (model.document_mask) too."""
from __future__ import annotations

import pytest
import torch

from recipes.config.loading import recipe_from_dict

pytestmark = pytest.mark.unit


def _flatten(batch):
    inputs, (labels, mask) = batch
    return [*(inputs if isinstance(inputs, tuple) else (inputs,)), labels, mask]


@pytest.mark.parametrize("positions", [False, True], ids=["tokens", "document_mask"])
def test_loader_workers_give_identical_batches(positions, short_doc_corpus, single_process_group, tmp_path):
    from recipes.train.data import MicroBatches, build_datasets

    recipe = recipe_from_dict({
        "model": dict(num_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=320, seq_length=64,
                      document_mask=positions),
        "training": {"global_batch": 8}, "data": {"manifests": [str(short_doc_corpus)], "split": "90,10,0"}})
    train, _ = build_datasets(recipe, 200, 8, str(tmp_path / "cache"))
    cpu = torch.device("cpu")
    G = 8  # micro_batch 2 x grad_accum 2 x DP 2
    for dp_rank in (0, 1):
        make = lambda n: MicroBatches(train, micro_batch=2, grad_accum=2, dp_rank=dp_rank, dp_size=2, device=cpu,
                                      positions=positions, num_workers=n)
        inline, workers = make(0), make(2)
        loaders = []
        for consumed in (0, G, 2 * G, 7 * G, 8 * G, 3 * G):  # sequential, a resume-like jump, sequential, back
            want = [_flatten(b) for b in inline.step(consumed)]
            got = [_flatten(b) for b in workers.step(consumed)]
            assert len(got) == len(want) == 2
            for w, g in zip(want, got):
                assert len(w) == len(g) == (4 if positions else 3)
                for a, b in zip(w, g):
                    assert a.dtype == b.dtype and torch.equal(a, b), (dp_rank, consumed)
            loaders.append(workers._loader)
        # the workers kept reading ahead across consecutive steps and restarted only at the jumps
        assert loaders[0] is loaders[1] is loaders[2] and loaders[3] is not loaders[2]
        assert loaders[3] is loaders[4] and loaders[5] is not loaders[4]
    # different DP ranks read different samples (the comparison above is not trivially of equal data)
    a = _flatten(next(MicroBatches(train, 2, 2, 0, 2, cpu).step(0)))[0]
    b = _flatten(next(MicroBatches(train, 2, 2, 1, 2, cpu).step(0)))[0]
    assert not torch.equal(a, b)


def _gone(pids, me, timeout=20.0) -> bool:
    import time

    deadline = time.time() + timeout
    while pids & {p.pid for p in me.children()} and time.time() < deadline:
        time.sleep(0.05)
    return not pids & {p.pid for p in me.children()}


def test_loader_workers_stop_when_replaced_or_dropped(short_doc_corpus, single_process_group, tmp_path):
    """A jump (resume, each evaluation) replaces the DataLoader iterator, and a MicroBatches can be dropped: the
    workers stop then, not whenever the cyclic garbage collector next runs (a sampler holding its MicroBatches made
    a cycle, and the collector then stopped the workers inside a later step: 40 s of joins measured in a test)."""
    import gc

    import psutil

    from recipes.train.data import MicroBatches, build_datasets

    recipe = recipe_from_dict({
        "model": dict(num_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=320, seq_length=64),
        "training": {"global_batch": 4}, "data": {"manifests": [str(short_doc_corpus)], "split": "90,10,0"}})
    train, _ = build_datasets(recipe, 200, 4, str(tmp_path / "cache"))
    me = psutil.Process()
    gc.disable()
    try:
        batches = MicroBatches(train, 2, 2, 0, 1, torch.device("cpu"), num_workers=2)
        before = {p.pid for p in me.children()}
        list(batches.step(0))
        first = {p.pid for p in me.children()} - before
        assert len(first) == 2, first  # the first iterator's two workers
        list(batches.step(40))  # a jump: a new iterator, the old one dropped
        assert _gone(first, me), "the replaced iterator's workers are still running"
        second = {p.pid for p in me.children()} - before
        assert len(second) == 2, second
        del batches
        assert _gone(second, me), "a dropped MicroBatches' workers are still running"
    finally:
        gc.enable()
