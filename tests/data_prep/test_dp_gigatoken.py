"""gigatoken gives every family it supports the library's own ids (or is not used, with the reason), its encode
cache is dropped without changing ids, and the pipeline writes on it exactly what it writes on the library."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.data_prep.test_dp_tiktoken import _docs, _library_ids
from tests.support.data_prep import read_all_docs, write_jsonl

from data_prep.steps.fast_path import FastEncoder
from data_prep.steps.gigatoken_bpe import CacheBound, GigatokenBPE
from data_prep.steps.tokenizers import load_tokenizer

pytestmark = pytest.mark.unit

FAMILIES = ["sp_model", "sp_model_nfkc", "sp_model_nfkc_cf", "hf_bpe", "hf_llama3_style"]


@pytest.mark.parametrize("model", FAMILIES)
def test_every_family_runs_on_gigatoken_with_the_library_ids(model, texts, request):
    path = request.getfixturevalue(model)
    enc = FastEncoder(load_tokenizer(path))
    docs = _docs(texts)
    enc.self_check(docs[:20])
    assert enc.method == "gigatoken", enc.describe()
    got = [a.tolist() for i in range(0, len(docs), 64) for a in enc.encode_arrays(docs[i : i + 64])]
    want = _library_ids(path, docs)
    bad = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    assert not bad, [docs[i][:60] for i in bad[:3]]


@pytest.mark.parametrize("model", ["sp_model_nfkc", "sp_model_nfkc_cf"])
def test_control_pieces_and_kept_whitespace_at_the_ends(model, request):
    """sentencepiece never matches <s>/</s>/<pad> in text (gigatoken would), strips only spaces at the ends (the
    converted normalizer strips any whitespace) and a trailing U+2581: each case gives the library's ids."""
    path = request.getfixturevalue(model)
    enc = FastEncoder(load_tokenizer(path))
    docs = ["a </s> b", "<s>x<unk>", "<pad>", "(?P<S>x)", "ＡＢＣ<S>", "line\n", "tab\t", "x\u0085", " \n lead",
            "a\u2581", "x \u2581", "\u2581a", "plain text", "end\u2028", "\u3000wide\u3000", "mixed \n \t "]
    assert [a.tolist() for a in enc.encode_arrays(docs)] == _library_ids(path, docs)


@pytest.mark.parametrize("model", ["sp_model_nfkc", "sp_model_nfkc_cf"])
def test_combining_marks_after_another_character_get_the_library_ids(model, request):
    """The converted normalizer maps grapheme clusters whole: it dropped the accent of U+00A0 U+0301 and the mark
    of U+0387 U+0483 (found in the bench's 155 MB corpus); sentencepiece keeps them. Non-ASCII texts therefore go
    through sentencepiece's own normalizer."""
    path = request.getfixturevalue(model)
    tok = load_tokenizer(path)
    g, why = GigatokenBPE.build(tok)
    assert why is None
    docs = ["    'acute': '\\u0301', # \xa0\u0301 COMBINING ACUTE ACCENT", "x \xa0\u0301",
            'r"[\\w\u00b7\u0300-\u036f\u0387\u0483-\u0487\u0591-\u05bd]"', "caf\u00e9 e\u0301 plain ascii"]
    flat, off = g.encode_flat(docs, tok.encode_batch)
    assert [flat[a:b].tolist() for a, b in zip(off[:-1], off[1:])] == _library_ids(path, docs)


class Always(CacheBound):
    def after_batch(self, nbytes):
        self.resets += 1
        return True


def test_cache_bound_resets_when_memory_grows_past_its_budget():
    b = CacheBound(budget_mb=10, warm_bytes=100, min_bytes=1000)
    assert not b.after_batch(50)  # warming up
    assert not b.after_batch(60)  # takes the base
    assert not b.after_batch(10)
    b.base -= 11  # as if RSS had grown 11 MB since
    assert b.after_batch(1000) and b.resets == 1
    assert not b.after_batch(10)  # over the budget still, but too soon after the last drop
    assert b.after_batch(1000) and b.resets == 2


def test_default_bound_drops_the_cache_within_the_warm_up_of_text_past_the_line():
    """Between the line's crossing and the drop the cache grows on, by what the text read meanwhile adds. With a
    32 MB window a worker of the 32 MB bench run (16 MB of text) never dropped, one of the 320 MB run grew up to 24 MB
    past the line first: peak RSS 1.30x (identity). Past the line, the default drops within 8 MB of text of the
    last drop (or of the start), so the peak does not grow with the text a worker sees."""
    b = CacheBound()
    mb = 1 << 20
    assert not b.after_batch(b.warm_bytes)  # takes the base
    b.base -= b.budget_mb + 64  # as if RSS had grown well past the line (whatever it does meanwhile)
    drops = [b.after_batch(mb) for _ in range(9)]  # 17 MB in all: about a 1x worker's share
    assert drops[0], "over the line 9 MB after the start: dropped at once"
    assert not any(drops[1:8]), "too soon after the last drop"
    assert drops[8] and b.resets == 2, "over the line 8 MB after the last drop: dropped"


def test_encoder_pins_the_mmap_threshold_so_a_cache_drop_unmaps_it(sp_model_nfkc):
    """nmt_nfkc at 10x grew past the cache bound because glibc had raised its mmap threshold (a freed MB-sized block
    does that) before the encoders were built: their tables went to the heap, where a drop cannot give them back.
    Built now, the encoder pins it: a block of the size of a grown cache table is mmapped even after such a free.
    Probed in a fresh interpreter, as a worker is (tests/data_prep/mmap_probe.py)."""
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("mmap_probe.py")), sp_model_nfkc],
                       capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["why"] is None and got["pinned"]
    assert got["table"], "a cache-table-sized block came from the heap: a drop would not return it"
    assert not got["small"]  # small blocks (a batch's arrays) stay in the heap


def test_cache_reset_keeps_ids(hf_bpe, sp_model_nfkc_cf, texts):
    for path in (hf_bpe, sp_model_nfkc_cf):
        tok = load_tokenizer(path)
        g, why = GigatokenBPE.build(tok)
        assert why is None
        g.bound = Always()  # a fresh cache after every batch
        docs = _docs(texts)
        got = []
        for i in range(0, len(docs), 16):
            flat, off = g.encode_flat(docs[i : i + 16], tok.encode_batch)
            got += [flat[a:b].tolist() for a, b in zip(off[:-1], off[1:])]
        assert g.bound.resets == -(-len(docs) // 16)
        assert got == _library_ids(path, docs)


def test_unigram_and_self_check_mismatch_fall_back_with_the_reason(sp_model_unigram, hf_bpe, texts):
    enc = FastEncoder(load_tokenizer(sp_model_unigram))
    assert enc.gigatoken is None and "not a BPE model" in enc.describe()
    enc = FastEncoder(load_tokenizer(hf_bpe))
    g = enc.gigatoken
    g.backend = g._load(g.json.replace('"add_prefix_space":false', '"add_prefix_space":true')
                        .replace('"add_prefix_space": false', '"add_prefix_space": true'))
    enc.self_check(texts[:20])
    assert enc.method == "tiktoken" and "not gigatoken: self-check mismatch" in enc.describe()


def test_pipeline_on_gigatoken_writes_the_library_ids(tmp_path, texts, sp_model, hf_bpe):
    """End to end (BOS, EOD, a long document split, --verify-fraction 1.0): the shards equal --no-fast-path's."""
    from data_prep.pipeline import run
    from data_prep.settings import Settings

    docs = texts[:60] + ["x " * 3000]
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in docs])
    for tok in (sp_model, hf_bpe):
        outs = []
        for fast in (True, False):
            out = tmp_path / f"{fast}_{len(outs)}_{tok[-5:]}"
            run(Settings(inputs=[str(tmp_path / "a.jsonl")], output_dir=str(out), tokenizer=tok, fast_path=fast,
                         verify_fraction=1.0, add_bos=True, max_doc_tokens=1000, quiet=True))
            outs.append(read_all_docs(out)[1])
        assert outs[0] == outs[1]
        assert max(len(d) for d in outs[0]) == 1000 and len(outs[0]) > len(docs)


def test_flat_batch_with_eod_equals_per_document(tmp_path, texts, hf_bpe):
    from data_prep.pipeline import run
    from data_prep.settings import Settings

    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts[:40]])
    run(Settings(inputs=[str(tmp_path / "a.jsonl")], output_dir=str(tmp_path / "o"), tokenizer=hf_bpe, quiet=True))
    _, got = read_all_docs(tmp_path / "o")
    eod = load_tokenizer(hf_bpe).info.eod_id
    assert got == [ids + [eod] for ids in _library_ids(hf_bpe, texts[:40])]
    assert np.mean([len(d) for d in got]) > 10


def test_driver_self_check_reads_the_first_unit_and_falls_back_before_the_fork(tmp_path, hf_bpe, texts):
    """preload with the first unit to do checks the encoder there (forked workers inherit it checked): a wrong
    gigatoken is dropped for tiktoken before any worker starts, on the unit's first documents."""
    from data_prep.read.units import list_inputs, plan_units
    from data_prep.settings import Settings
    from data_prep.steps import tokenize

    path = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts[:40]])
    unit = plan_units(list_inputs([str(path)]), 1 << 30)[0]
    settings = Settings(inputs=[str(path)], output_dir=str(tmp_path / "out"), tokenizer=hf_bpe)
    assert tokenize._first_texts(unit, settings) == tokenize._sample(texts[:40])
    tok = load_tokenizer(hf_bpe)
    enc = FastEncoder(tok)
    g = enc.gigatoken
    g.backend = g._load(g.json.replace('"add_prefix_space":false', '"add_prefix_space":true')
                        .replace('"add_prefix_space": false', '"add_prefix_space": true'))
    try:
        tokenize.preload(settings, tok, enc, unit)
        assert tokenize._STATE["enc_checked"] and enc.method == "tiktoken", enc.describe()
        assert "not gigatoken: self-check mismatch" in enc.describe()
    finally:
        tokenize._STATE.clear()
