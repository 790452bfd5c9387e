"""Every input format -> shards that megatron-core reads, ids equal to the tokenizer's own encoding + EOD."""

import gzip
import os

import numpy as np
import pytest
import sentencepiece as spm
from tests.support.data_prep import read_all_docs, write_jsonl

from data_prep.pipeline import Settings, run


def _sp_expected(model, texts, bos=False):
    sp = spm.SentencePieceProcessor(model_file=model)
    return [([sp.bos_id()] if bos else []) + ids + [sp.eos_id()] for ids in sp.encode(texts)]


@pytest.fixture(scope="module")
def small(texts):
    return texts[:12] + texts[-10:]


def _run(inputs, out, tok, **kw):
    return run(Settings(inputs=[str(i) for i in inputs], output_dir=str(out), tokenizer=tok, quiet=True, **kw))


@pytest.mark.multiproc
def test_jsonl_json_gz_zst_txt_parquet_and_megatron_reader(tmp_path, small, sp_model):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    d = tmp_path / "in"
    d.mkdir()
    a, b, c, e, f = small[:4], small[4:8], small[8:12], small[12:16], small[16:20]
    write_jsonl(d / "a.jsonl", [{"text": t, "id": i} for i, t in enumerate(a)])
    write_jsonl(d / "b.json", [{"text": t} for t in b])
    raw = b"".join(__import__("orjson").dumps({"text": t}) + b"\n" for t in c)
    (d / "c.jsonl.gz").write_bytes(gzip.compress(raw))
    raw = b"".join(__import__("orjson").dumps({"text": t}) + b"\n" for t in e)
    (d / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    pq.write_table(pa.table({"text": f}), d / "e.parquet", row_group_size=2)
    (d / "f.txt").write_text(small[20], encoding="utf-8")
    out = tmp_path / "out"
    m = _run([d], out, sp_model, workers=2, shard_size=4096)
    manifest, docs = read_all_docs(out)
    want = _sp_expected(sp_model, a + b + c + e + f + [small[20]])
    assert docs == want
    assert manifest["dtype"] == "uint16"
    assert m["totals"]["documents"] == len(want) and m["totals"]["input_records"] == len(want)
    assert m["blend"][1::2] == [s["prefix"] for s in m["shards"]]
    assert m["blend"][0::2] == [s["tokens"] for s in m["shards"]]
    assert sum(m["blend"][0::2]) == sum(len(x) for x in want)
    for s in m["shards"]:
        assert os.path.getsize(out / (s["prefix"] + ".bin")) == s["tokens"] * 2 == s["bytes"]


@pytest.mark.unit
def test_hf_dataset_saved_to_disk_and_bos_option(tmp_path, small, sp_model):
    import datasets

    dsdict = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": small[:5]}),
                                   "validation": datasets.Dataset.from_dict({"text": small[5:7]})})
    dsdict.save_to_disk(str(tmp_path / "ds"))
    out = tmp_path / "out"
    _run([tmp_path / "ds"], out, sp_model, add_bos=True)
    _, docs = read_all_docs(out)
    # DatasetDict splits are read in name order: train, validation
    assert docs == _sp_expected(sp_model, small[:5] + small[5:7], bos=True)


@pytest.mark.unit
def test_hf_tokenizer_json_and_transformers_dir(tmp_path, small, hf_bpe):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    write_jsonl(tmp_path / "a.jsonl", [{"body": t} for t in small])
    tok = Tokenizer.from_file(hf_bpe)
    eod = tok.token_to_id("<|endoftext|>")
    want = [e.ids + [eod] for e in tok.encode_batch(small, add_special_tokens=False)]
    out = tmp_path / "out_json"
    m = _run([tmp_path / "a.jsonl"], out, hf_bpe, text_field="body")
    assert read_all_docs(out)[1] == want
    assert m["tokenizer"]["type"] == "hf" and m["tokenizer"]["eod_id"] == eod

    tdir = tmp_path / "tok_dir"
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(str(tdir))
    out2 = tmp_path / "out_dir"
    _run([tmp_path / "a.jsonl"], out2, str(tdir), text_field="body")
    assert read_all_docs(out2)[1] == want


@pytest.mark.unit
def test_long_documents_split_into_sequences_of_one_document(tmp_path, texts, sp_model):
    from data_prep.write.shards import indexed_dataset_class

    big = max(texts, key=len)
    write_jsonl(tmp_path / "a.jsonl", [{"text": big}, {"text": "short one"}])
    out = tmp_path / "out"
    m = _run([tmp_path / "a.jsonl"], out, sp_model, max_doc_tokens=100)
    full = _sp_expected(sp_model, [big, "short one"])
    ds = indexed_dataset_class()(str(out / m["shards"][0]["prefix"]))
    n0 = -(-len(full[0]) // 100)
    assert len(ds) == n0 + 1 and list(ds.document_indices) == [0, n0, n0 + 1]
    assert np.concatenate([ds[i] for i in range(n0)]).tolist() == full[0]
    assert all(len(ds[i]) == 100 for i in range(n0 - 1))
    assert m["shards"][0]["documents"] == 2 and m["shards"][0]["sequences"] == n0 + 1

    out2 = tmp_path / "out2"
    m2 = _run([tmp_path / "a.jsonl"], out2, sp_model, max_doc_tokens=100, long_docs="reject")
    assert m2["totals"]["rejected"] == {"too_long": 1} and m2["totals"]["documents"] == 1
    assert read_all_docs(out2)[1] == [full[1]]


@pytest.mark.unit
def test_vocab_at_least_65500_uses_int32(tmp_path, small):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(65600)}
    vocab.update({chr(c): 65600 + c - 32 for c in range(32, 127)})
    vocab["</s>"] = 70000
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    write_jsonl(tmp_path / "a.jsonl", [{"text": "t65599 t1 zz"}])
    m = _run([tmp_path / "a.jsonl"], tmp_path / "out", str(path))
    assert m["dtype"] == "int32"
    assert read_all_docs(tmp_path / "out")[1] == [[65599, 1, 0, 70000]]


@pytest.mark.multiproc
@pytest.mark.parametrize("fmt", ["parquet", "hf"])
def test_big_parquet_and_datasets_are_cut_into_row_ranges(tmp_path, texts, sp_model, fmt):
    """A parquet file bigger than --shard-size is cut along its row groups, a saved dataset at rows, one unit each,
    so many workers share one big input. Same documents in the same order as reading it whole, whatever the number
    of workers; rejected rows keep their row number in the whole input; the manifest's input ranges cover every row
    once."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [t[:3000] for t in texts[:60]]
    rows[7] = ""  # rejected: empty text, at row 7 of the whole input
    if fmt == "parquet":
        src = tmp_path / "big.parquet"
        pq.write_table(pa.table({"text": rows}), src, row_group_size=4)  # 15 row groups
    else:
        import datasets

        src = tmp_path / "ds"
        datasets.Dataset.from_dict({"text": rows}).save_to_disk(str(src))
    whole = _run([src], tmp_path / "whole", sp_model, shard_size=1 << 30)
    assert len(whole["shards"]) == 1
    outs = []
    for workers in (1, 3):
        out = tmp_path / f"cut{workers}"
        m = _run([src], out, sp_model, shard_size=8_000, workers=workers)
        outs.append(read_all_docs(out)[1])
        ranges = [r for s in m["shards"] for r in s["inputs"]]
        assert len(ranges) >= 4 and ranges[0]["start"] == 0 and ranges[-1]["end"] == len(rows)
        assert all(a["end"] == b["start"] for a, b in zip(ranges, ranges[1:])), ranges
        if fmt == "parquet":
            assert all(r["start"] % 4 == 0 for r in ranges)  # row-group boundaries
        rejects = [json.loads(x) for x in open(out / "rejects.jsonl")]
        assert [(r["row"], r["reason"]) for r in rejects] == [(7, "empty_text")]
        assert m["totals"]["input_records"] == len(rows) and m["totals"]["rejected"] == {"empty_text": 1}
    assert outs[0] == outs[1] == read_all_docs(tmp_path / "whole")[1]
    assert outs[0] == _sp_expected(sp_model, [r for r in rows if r])
