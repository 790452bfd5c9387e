"""Filter and dedup steps (data_prep curate, tokenize --steps): planted duplicates, one-rule documents, workers."""

import json
import re

import numpy as np
import orjson
import pytest
from tests.support.data_prep import read_all_docs, run_cli, tree_bytes, write_duplicated_corpus, write_jsonl

from data_prep.curate import CurateSettings, run
from data_prep.executors.base import UnitsFailed
from data_prep.steps.filters import QualityConfig, QualityFilter
from data_prep.steps.step_list import StepListError, parse_steps

DEDUP_STEPS = {"steps": [{"exact_dedup": {}}, {"minhash_dedup": {"threshold": 0.8, "num_perm": 128}}], "buckets": 8}


def _vocab(rng, n=400, lo=3, hi=9):
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return ["".join(rng.choice(letters, int(rng.integers(lo, hi)))) for _ in range(n)]


def _shingles(text, n=5):
    """An independent shingle set: word 5-grams of the lower-cased text, as tuples."""
    w = text.lower().split()
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def _jaccard(a, b):
    sa, sb = _shingles(a), _shingles(b)
    return len(sa & sb) / len(sa | sb)


def _change_words(text, count, tag):
    """``count`` words replaced, spread evenly, by words found nowhere else: each kills 5 shingles of ~196."""
    w = text.split()
    for k in range(count):
        w[(k + 1) * len(w) // (count + 1)] = f"qq{tag}x{k}"
    return " ".join(w)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Base documents (unrelated), then exact copies, copies at J ~0.95 (above 0.8) and at J ~0.6 (below), in
    another file and work unit; plus one exact copy inside the first file. Returns (dir, expected removals)."""
    rng = np.random.default_rng(7)
    vocab = _vocab(rng)
    base = [" ".join(rng.choice(vocab, 200)) for _ in range(40)]
    a = base + [base[20]]  # an exact copy later in the same file
    b = ([base[i] for i in range(5)] + [_change_words(base[i], 1, i) for i in range(5, 10)]
         + [_change_words(base[i], 10, i) for i in range(10, 15)] + [" ".join(rng.choice(vocab, 200))])
    for i in range(5, 10):
        assert _jaccard(base[i], b[i]) > 0.93
    for i in range(10, 15):
        assert 0.5 < _jaccard(base[i], b[i]) < 0.65
    d = tmp_path_factory.mktemp("planted")
    write_jsonl(d / "a.jsonl", [{"text": t} for t in a])
    write_jsonl(d / "b.jsonl", [{"text": t} for t in b])
    offsets_a = np.cumsum([0] + [len(orjson.dumps({"text": t})) + 1 for t in a]).tolist()
    offsets_b = np.cumsum([0] + [len(orjson.dumps({"text": t})) + 1 for t in b]).tolist()
    want = {(str(d / "a.jsonl"), offsets_a[40]): ("exact_dedup", "duplicate")}
    want.update({(str(d / "b.jsonl"), offsets_b[i]): ("exact_dedup", "duplicate") for i in range(5)})
    want.update({(str(d / "b.jsonl"), offsets_b[i]): ("minhash_dedup", "near_duplicate") for i in range(5, 10)})
    kept = base + b[10:]
    return d, want, kept


def _curate(inp, out, steps, workers=1, **kw):
    return run(CurateSettings(inputs=[str(inp)], output_dir=str(out), steps=steps, workers=workers,
                              shard_size=kw.pop("shard_size", 20_000), quiet=True, **kw))


def _removed(out):
    with open(out / "removed.jsonl", "rb") as f:
        return [orjson.loads(line) for line in f]


def _kept_texts(out, manifest):
    texts = []
    for entry in manifest["files"]:
        with open(out / entry["file"], "rb") as f:
            texts += [orjson.loads(line)["text"] for line in f]
    return texts


@pytest.mark.multiproc
def test_dedup_removes_exactly_the_planted_duplicates_same_for_1_and_4_workers(tmp_path, planted):
    inp, want, kept = planted
    m1 = _curate(inp, tmp_path / "w1", DEDUP_STEPS, workers=1)
    assert len(m1["files"]) >= 4  # several work units: the duplicates cross units
    got = {(r["file"], r["byte_offset"]): (r["step"], r["reason"]) for r in _removed(tmp_path / "w1")}
    assert got == want
    assert sorted(_kept_texts(tmp_path / "w1", m1)) == sorted(kept)
    t = m1["totals"]
    assert t["removed"] == {"exact_dedup": {"duplicate": 6}, "minhash_dedup": {"near_duplicate": 5}}
    assert t["input_records"] == t["documents"] + 11
    # every removed document names the kept copy (the smallest reference of its group)
    assert all(re.fullmatch(r"shard_\d{6}#\d+", r["duplicate_of"]) for r in _removed(tmp_path / "w1"))
    m4 = _curate(inp, tmp_path / "w4", DEDUP_STEPS, workers=4)
    assert m4 == m1 | {"files": m4["files"]}
    assert tree_bytes(tmp_path / "w4") == tree_bytes(tmp_path / "w1")
    # a rerun of a complete output skips every pass and rewrites nothing
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "w1").rglob("*.json")}
    _curate(inp, tmp_path / "w1", DEDUP_STEPS, workers=2)
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "w1").rglob("*.json") if p.name != "curation.json"}
    assert all(before[k] == v for k, v in after.items())


@pytest.mark.multiproc
def test_tokenize_with_steps_equals_tokenizing_the_curated_jsonl(tmp_path, planted, sp_model):
    inp, _, kept = planted
    steps = tmp_path / "steps.yaml"
    steps.write_text("steps:\n  - exact_dedup: {}\n  - minhash_dedup: {threshold: 0.8}\nbuckets: 8\n")
    out = tmp_path / "tok"
    run_cli("tokenize", inp, "-o", out, "-t", sp_model, "--steps", steps, "--shard-size", "20000", "-j", "4", "-q")
    m, docs = read_all_docs(out)
    assert m["totals"]["removed"] == {"exact_dedup": {"duplicate": 6}, "minhash_dedup": {"near_duplicate": 5}}
    assert run_cli("verify", out).returncode == 0
    # the same documents, in the same order, as tokenizing the jsonl the curate command keeps
    cur = tmp_path / "cur"
    run_cli("curate", inp, "-o", cur, "--steps", steps, "--shard-size", "20000", "-j", "2", "-q")
    ref = tmp_path / "ref"
    run_cli("tokenize", cur, "-o", ref, "-t", sp_model, "--shard-size", "10G", "-q")
    assert read_all_docs(ref)[1] == docs and len(docs) == len(kept)


def _prose(rng, vocab, lines=10, words=10, stop=True, end="."):
    out = []
    for _ in range(lines):
        w = list(rng.choice(vocab, words - (2 if stop else 0)))
        if stop:
            w = ["The"] + w[:4] + ["and"] + w[4:]
        out.append(" ".join(w) + end)
    return out


def _edit(lines, f):
    """``f(i, word)`` applied to the i-th word of each line that is not one of its stop words (kept as they are)."""
    out = []
    for ln in lines:
        words, i = [], 0
        for w in ln.split():
            if w in ("The", "and"):
                words.append(w)
            else:
                core, dot = (w[:-1], ".") if w.endswith(".") else (w, "")
                words.append(f(i, core) + dot)
                i += 1
        out.append(" ".join(words))
    return "\n".join(out)


def _one_rule_docs(rng):
    """Documents built to fail one rule each (name -> text), and a good one."""
    vocab = _vocab(rng, 300, 3, 8)
    good = _prose(rng, vocab)
    docs = {"good": "\n".join(good)}
    docs["doc_words"] = "\n".join(good[:3])
    docs["mean_word_length"] = "\n".join(_prose(rng, _vocab(rng, 300, 13, 17)))
    docs["symbol_word_ratio"] = _edit(good, lambda i, w: w + "#x" if i % 6 == 0 else w)
    docs["digit_fraction"] = _edit(good, lambda i, w: f"x{int(rng.integers(10**5, 10**6))}" if i % 3 else w)
    docs["alpha_words"] = _edit(good, lambda i, w: "---" if i % 2 else w)
    docs["stop_words"] = "\n".join(_prose(rng, vocab, stop=False))
    tails = ["See more.", "Next page."] * 3 + [""] * 4  # short repeated lines: 6 of 16 lines repeat
    docs["duplicate_lines"] = "\n".join(x for ln, t in zip(good, tails) for x in (ln, t) if x)
    docs["punctuation_lines"] = "\n".join(_prose(rng, vocab, end=""))
    words = " ".join(good).split()
    for i in range(3, len(words), 4):
        words[i] = "big cat"
    docs["top_ngram"] = " ".join(words[:60]) + "\n" + " ".join(words[60:]) + "."
    rep = " ".join(good[1].split()[:-1])
    docs["dup_ngram"] = "\n".join(good[:4] + [rep + " done."] + good[4:8] + [rep + " again."] + good[8:])
    docs["bullet_lines"] = "\n".join("\u2022 " + ln for ln in good)
    docs["ellipsis_lines"] = "\n".join(ln[:-1] + "\u2026" if i % 2 else ln for i, ln in enumerate(good))
    paras = ["\n".join(good[i:i + 2]) for i in range(0, 10, 2)] + ["\n".join(_prose(rng, vocab, lines=4))]
    docs["duplicate_paragraphs"] = "\n\n".join(paras + ["See more."] * 5)  # 4 repeats of 11 paragraphs
    # one long token repeated (no repeated n-gram around it): its characters alone exceed a fifth of the text
    size = int(0.23 * len("\n".join(good)) / 0.54)  # > 20% of the text, the mean word length still <= 10
    token = "https://example.org/" + "".join(rng.choice(list("abcdefgh"), size - 20))
    docs["duplicate_paragraph_chars"] = "\n\n".join(["\n".join(good[:5]), token, "\n".join(good[5:]), token])
    docs["duplicate_line_chars"] = "\n".join(good[:5] + [token] + good[5:] + [token])
    return docs


OFF = {"doc_words": ("min_words", "max_words"), "mean_word_length": ("min_mean_word_length", "max_mean_word_length"),
       "symbol_word_ratio": ("max_symbol_word_ratio",), "digit_fraction": ("max_digit_fraction",),
       "alpha_words": ("min_alpha_word_fraction",), "stop_words": ("min_stop_words",),
       "duplicate_lines": ("max_duplicate_line_fraction",), "punctuation_lines": ("min_punctuation_line_fraction",),
       "top_ngram": ("top_ngram_char_fraction",), "dup_ngram": ("dup_ngram_char_fraction",),
       "bullet_lines": ("max_bullet_line_fraction",), "ellipsis_lines": ("max_ellipsis_line_fraction",),
       "duplicate_paragraphs": ("max_duplicate_paragraph_fraction",),
       # a repeated paragraph of one line is a repeated line too
       "duplicate_paragraph_chars": ("max_duplicate_paragraph_char_fraction", "max_duplicate_line_char_fraction"),
       "duplicate_line_chars": ("max_duplicate_line_char_fraction",)}


@pytest.mark.multiproc
def test_each_quality_rule_removes_the_document_built_to_fail_it_and_only_that(tmp_path):
    docs = _one_rule_docs(np.random.default_rng(3))
    names = list(docs)
    # the documents fail exactly one rule each: with that rule off, the filter keeps them
    for name, text in docs.items():
        if name != "good":
            assert QualityFilter(QualityConfig()).check(text) == name
            assert QualityFilter(QualityConfig(**{f: None for f in OFF[name]})).check(text) is None, name
    assert QualityFilter(QualityConfig()).check(docs["good"]) is None
    inp = tmp_path / "in"
    inp.mkdir()
    write_jsonl(inp / "docs.jsonl", [{"text": docs[n]} for n in names] * 2)
    m = _curate(inp, tmp_path / "out", {"steps": [{"quality": {}, "name": "gopher"}]}, workers=2, shard_size=2000)
    removed = _removed(tmp_path / "out")
    offsets = np.cumsum([0] + [len(orjson.dumps({"text": docs[n]})) + 1 for n in names * 2]).tolist()
    by_offset = {r["byte_offset"]: r["reason"] for r in removed}
    assert {o: (names * 2)[i] for i, o in enumerate(offsets[:-1]) if (names * 2)[i] != "good"} == by_offset
    assert m["totals"]["removed"] == {"gopher": {n: 2 for n in sorted(OFF)}}
    assert _kept_texts(tmp_path / "out", m) == [docs["good"]] * 2


@pytest.mark.multiproc
def test_digit_rule_count_equals_an_independent_count_over_real_text(tmp_path, corpus_dir):
    """One rule on, over the stdlib sample, against a regex count written here."""
    steps = {"steps": [{"quality": {f: None for fs in OFF.values() for f in fs} | {"max_digit_fraction": 0.02}}]}
    m = _curate(corpus_dir, tmp_path / "out", steps, workers=2, shard_size=100_000)
    with open(corpus_dir / "stdlib.jsonl", "rb") as f:
        texts = [orjson.loads(line)["text"] for line in f]
    want = sum(1 for t in texts if len(re.findall(r"\d", t)) / len(re.sub(r"\s", "", t)) > 0.02)
    assert 0 < want < len(texts)
    assert m["totals"]["removed"] == {"quality": {"digit_fraction": want}}


@pytest.mark.unit
def test_step_list_errors_name_the_step_and_field(tmp_path):
    with pytest.raises(StepListError, match=r"steps\[1\]: unknown step 'exact_dedupe' \(did you mean 'exact_dedup'"):
        parse_steps({"steps": [{"quality": {}}, {"exact_dedupe": {}}]})
    with pytest.raises(StepListError, match=r"steps\[0\]\.quality: min_word: Extra inputs"):
        parse_steps({"steps": [{"quality": {"min_word": 3}}]})
    with pytest.raises(StepListError, match=r"steps\[0\]\.minhash_dedup: threshold: Input should be less than 1"):
        parse_steps({"steps": [{"minhash_dedup": {"threshold": 1.5}}]})
    bad = tmp_path / "s.yaml"
    bad.write_text("steps:\n  - quality: {min_words: [}\n")
    r = run_cli("curate", tmp_path, "-o", tmp_path / "o", "--steps", bad, check=False)
    assert r.returncode == 2 and f"{bad}: not valid YAML" in r.stderr
    s = parse_steps([{"minhash_dedup": {"threshold": 0.8}}])
    assert json.dumps(s.as_dict())  # every default filled in, recorded in the manifest


def _arrays(stdout):
    """`slurm --dry-run` output -> {pass: its --array spec}."""
    return dict(re.findall(r"# \S+/(\w+)_0000\.sbatch\n(?:.*\n)*?#SBATCH --array=(\S+)", stdout))


@pytest.mark.multiproc
def test_two_slices_by_stage_by_hand_equal_one_run_and_resubmit_per_stage(tmp_path):
    """The claim of docs/curation.md: 2 slices x (hash, buckets, filter), each stage finished by every slice before
    the next, give the bytes of one run; `slurm --only-incomplete` resubmits, per pass, the slices with work left."""
    inp, steps = write_duplicated_corpus(tmp_path / "in")
    ref = _curate(inp, tmp_path / "ref", steps)
    assert ref["totals"]["removed"] == {"exact_dedup": {"duplicate": 3}, "minhash_dedup": {"near_duplicate": 3}}
    out = tmp_path / "out"
    with pytest.raises(UnitsFailed, match="--stage buckets needs --stage hash of every slice"):
        _curate(inp, out, steps, slice_index=0, slice_count=2, stage="buckets")
    cargs = ["curate", inp, "-o", out, "--steps", steps, "--shard-size", "20000"]
    for stage in ("hash", "buckets", "filter"):
        for i in (1, 0):
            r = _curate(inp, out, steps, slice_index=i, slice_count=2, stage=stage)
            assert (r is None) == (stage != "filter" or i == 1)  # the last filter slice writes curation.json
            if (stage, i) == ("hash", 1):  # slice 0 "failed" its hash task: only it is resubmitted for hash
                r = run_cli("slurm", "--tasks", 2, "--scripts-dir", tmp_path / "s", "--dry-run", "--only-incomplete",
                            "--", *cargs)
                assert _arrays(r.stdout) == {"hash": "0", "buckets": "0-1", "filter": "0-1"}, r.stdout
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")
    r = run_cli("slurm", "--tasks", 2, "--scripts-dir", tmp_path / "s2", "--only-incomplete", "--", *cargs)
    assert "nothing to submit" in r.stdout


@pytest.mark.multiproc
def test_tokenize_steps_slurm_scripts_run_stage_by_stage_equal_one_run(tmp_path, sp_model):
    """`slurm -- INPUTS -t TOK --steps` renders three arrays of `tokenize --stage`; their tasks, run here pass by pass
    as Slurm would (SLURM_ARRAY_TASK_ID set), then finalize, give the bytes of one `tokenize --steps` run."""
    import os
    import subprocess

    from data_prep.pipeline import Settings
    from data_prep.pipeline import run as tokenize

    inp, steps = write_duplicated_corpus(tmp_path / "in")
    m = tokenize(Settings(inputs=[inp], output_dir=str(tmp_path / "ref"), tokenizer=sp_model, steps=steps,
                          shard_size=20_000, quiet=True))
    assert m["totals"]["removed"] == {"exact_dedup": {"duplicate": 3}, "minhash_dedup": {"near_duplicate": 3}}
    s = tmp_path / "s"
    r = run_cli("slurm", "--tasks", 2, "--scripts-dir", s, "--dry-run", "--", inp, "-o", tmp_path / "out", "-t",
                sp_model, "--steps", steps, "--shard-size", "20000")
    assert _arrays(r.stdout) == {"hash": "0-1", "buckets": "0-1", "filter": "0-1"}, r.stdout
    assert "-m data_prep tokenize " in (s / "hash_0000.sbatch").read_text()
    env = dict(os.environ, OMP_NUM_THREADS="1", SLURM_CPUS_PER_TASK="1")
    for stage in ("hash", "buckets", "filter"):
        for task in ("1", "0"):
            subprocess.run(["bash", str(s / f"{stage}_0000.sbatch")], check=True, capture_output=True,
                           env=dict(env, SLURM_ARRAY_TASK_ID=task))
    subprocess.run(["bash", str(s / "finalize.sbatch")], check=True, capture_output=True, env=env)
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")
    with pytest.raises(ValueError, match="--stage hash needs --steps"):
        tokenize(Settings(inputs=[inp], output_dir=str(tmp_path / "x"), tokenizer=sp_model, stage="hash"))
