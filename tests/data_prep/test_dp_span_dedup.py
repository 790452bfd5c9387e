"""sentence_dedup and substring_dedup on planted repeats (cut exactly, first occurrence kept, the rest untouched, the
same bytes for 1 and 3 workers), and SIGKILL at any moment of a run with every new step, then a rerun: the bytes of
an uninterrupted run."""

import os
import signal
import subprocess
import sys
import time

import pytest
from tests.data_prep.curation_corpus import FRENCH, Prose, read_output, removals, write_records
from tests.support.data_prep import REPO, run_cli, tree_bytes

from data_prep.curate import CurateSettings, run


def _run(inp, out, steps, workers=2):
    return run(CurateSettings(inputs=[str(inp)], output_dir=str(out), steps=steps, workers=workers, shard_size=3000,
                              quiet=True))


@pytest.mark.multiproc
def test_sentence_dedup_cuts_repeated_three_sentence_spans_only(tmp_path):
    p = Prose(21)
    a = [p.doc(8) for _ in range(6)]
    src = a[2].split("\n")
    b_lines = [p.sentence() for _ in range(6)]
    planted = b_lines[:2] + src[3:6] + b_lines[2:]  # 3 sentences of a[2], in order, inside b
    two_only = [p.sentence() for _ in range(5)] + src[0:2]  # 2 sentences: no 3-sentence span repeats
    short = src[5:8] + ["Only a few words of its own remain here."]  # left with < 50 words once cut
    b = [p.doc(8), "\n".join(planted), "\n".join(two_only), "\n".join(short), p.doc(8)]
    inp = tmp_path / "in"
    inp.mkdir()
    write_records(inp / "a.jsonl", [{"id": f"a{i}", "text": t} for i, t in enumerate(a)])
    offs = write_records(inp / "b.jsonl", [{"id": f"b{i}", "text": t} for i, t in enumerate(b)])
    steps = {"steps": [{"sentence_dedup": {"n_sentences": 3, "min_doc_words": 50}}], "buckets": 4}
    m = _run(inp, tmp_path / "w2", steps)
    assert len(m["files"]) >= 3
    assert {(r["file"], r["byte_offset"], r["reason"]) for r in removals(tmp_path / "w2")} == \
        {(str(inp / "b.jsonl"), offs[3], "short_after_dedup")}
    want = a + [b[0], "\n".join(b_lines), b[2], b[4]]
    assert [r["text"] for r in read_output(tmp_path / "w2", m)] == want
    assert m["totals"]["modified"] == {"sentence_dedup": {"duplicate_sentences": 3}}
    _run(inp, tmp_path / "w1", steps, workers=1)
    assert tree_bytes(tmp_path / "w1") == tree_bytes(tmp_path / "w2")


@pytest.mark.multiproc
def test_substring_dedup_cuts_repeated_substrings_of_at_least_n_words(tmp_path):
    p = Prose(22)
    a = [p.doc(8) for _ in range(5)]
    words = a[1].split()
    sub = " ".join(words[7:32])  # 25 words, starting and ending mid-sentence
    short_sub = " ".join(words[40:59])  # 19 words: under the 20-word minimum
    pre, post = p.sentence(), p.sentence()
    b = [p.doc(6), f"{pre} {sub} {post}", f"{pre} {short_sub} {post}", f"{sub}\n{sub}"]
    inp = tmp_path / "in"
    inp.mkdir()
    write_records(inp / "a.jsonl", [{"text": t} for t in a])
    write_records(inp / "b.jsonl", [{"text": t} for t in b])
    m = _run(inp, tmp_path / "out", {"steps": [{"substring_dedup": {"min_words": 20}}], "buckets": 4})
    got = [r["text"] for r in read_output(tmp_path / "out", m)]
    assert got == a + [b[0], f"{pre} {post}", b[2]]
    assert {r["reason"] for r in removals(tmp_path / "out")} == {"empty"}  # b[3]: its own repeat and a[1]'s: all cut
    assert m["totals"]["modified"] == {"substring_dedup": {"duplicate_words": 25}}  # counted in kept documents


def _first_marker(out):
    return out.exists() and (any((out / "dedup").glob("hash_*.json")) if (out / "dedup").exists() else False)


def _run_until(args, out, kill_after=None):
    t0 = time.time()
    p = subprocess.Popen(args, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    first = None
    while p.poll() is None:
        if first is None and _first_marker(out):
            first = time.time() - t0
        if first is not None and kill_after is not None and time.time() - t0 >= first + kill_after:
            os.killpg(p.pid, signal.SIGKILL)  # the driver and its workers, mid-pass
            p.wait()
            return first, time.time() - t0, True
        time.sleep(0.002)
    assert p.returncode == 0
    return first if first is not None else time.time() - t0, time.time() - t0, False


# every new step in one list (sentence_dedup shares substring_dedup's passes: tests above)
STEPS = ("steps:\n  - url_filter: {domains: [e3.example]}\n  - language: {keep: [en]}\n  - pii: {}\n"
         "  - fineweb: {}\n  - c4: {}\n  - decontaminate: {against: [EVALS]}\n"
         "  - quality: {definitions: published, dup_ngram_char_fraction: null}\n  - exact_dedup: {}\n"
         "  - minhash_dedup: {}\n  - substring_dedup: {min_words: 20}\nbuckets: 4\n")


@pytest.mark.multiproc
def test_sigkill_at_any_moment_with_the_new_steps_then_rerun_is_byte_identical(tmp_path):
    p = Prose(30)
    docs = [{"id": i, "url": f"https://e{i % 7}.example/{i}", "text": p.doc(6)} for i in range(240)]
    for i in range(0, 240, 17):
        docs[i]["text"] += f"\nMail me at user{i}@example.net today, or the server at 8.8.{i}.1 instead."
    for i in range(5, 240, 23):
        docs[i]["text"] = FRENCH
    for i in range(9, 240, 19):  # 3-sentence spans repeated from earlier documents
        docs[i]["text"] += "\n" + "\n".join(docs[i - 9]["text"].split("\n")[1:4])
    inp = tmp_path / "in"
    inp.mkdir()
    for i in range(4, 240, 37):  # no line ends in punctuation
        docs[i]["text"] = docs[i]["text"].replace(".\n", "\n").rstrip(".")
    for i in range(11, 240, 29):  # 13-gram contamination, and 20-word substrings repeated from earlier documents
        docs[i]["text"] += "\n" + " ".join(docs[i - 11]["text"].split()[5:30]) + "."
    write_records(inp / "web.jsonl", docs)
    write_records(tmp_path / "evals.jsonl", [{"q": docs[k]["text"].split("\n")[2]} for k in range(3, 240, 31)])
    (tmp_path / "steps.yaml").write_text(STEPS.replace("EVALS", str(tmp_path / "evals.jsonl")))

    def cli(out):
        return [sys.executable, "-m", "data_prep", "curate", str(inp), "-o", str(out), "--steps",
                str(tmp_path / "steps.yaml"), "--shard-size", "8000", "-j", "2", "-q"]

    first, total, _ = _run_until(cli(tmp_path / "ref"), tmp_path / "ref")
    ref = tree_bytes(tmp_path / "ref")
    m = __import__("json").loads(ref["curation.json"])
    assert {"url_filter", "language", "decontaminate", "fineweb"} <= set(m["totals"]["removed"])
    assert set(m["totals"]["modified"]) == {"pii", "substring_dedup"} and m["totals"]["documents"] > 100
    work, kills = max(total - first, 0.01), 0
    for i, frac in enumerate((0.15, 0.45, 0.8)):
        for attempt in range(3):  # a run that finished before its moment is tried again, killed earlier
            out = tmp_path / f"killed{i}-{attempt}"
            first_i, total_i, killed = _run_until(cli(out), out, kill_after=frac * work / 2 ** attempt)
            if not killed:
                work = min(work, max(total_i - first_i, 0.01))
            run_cli(*cli(out)[3:])
            assert tree_bytes(out) == ref, f"rerun after a SIGKILL at {frac:.0%} of the work differs from a clean run"
            if killed:
                kills += 1
                break
    assert kills >= 2, f"only {kills} of 3 runs were still working when killed"
