"""The per-document curation steps on planted data: each planted document removed (or rewritten) exactly as planted,
with its reason; every other document kept byte for byte, its fields with it."""

import gzip

import pytest
from tests.data_prep.curation_corpus import FRENCH, GERMAN, Prose, read_output, removals, write_records

from data_prep.curate import CurateSettings, run
from data_prep.steps.step_list import StepListError, parse_steps



def _curate(tmp_path, records, steps, workers=2, name="a.jsonl", **kw):
    inp = tmp_path / "in"
    inp.mkdir(exist_ok=True)
    offsets = write_records(inp / name, records)
    out = tmp_path / "out"
    m = run(CurateSettings(inputs=[str(inp)], output_dir=str(out), steps=steps, workers=workers, shard_size=4000,
                           quiet=True, **kw))
    return m, out, offsets


def _removed_by_offset(out):
    return {r["byte_offset"]: (r["step"], r["reason"]) for r in removals(out)}


def _good(n, seed=1):
    p = Prose(seed)
    return [{"id": f"d{i}", "url": f"https://news.example.org/story/{i}", "text": p.doc(), "meta": {"n": i}}
            for i in range(n)]


@pytest.mark.multiproc
def test_language_removes_the_planted_french_and_german_and_labels_the_rest(tmp_path):
    recs = _good(12)
    recs[3]["text"], recs[8]["text"] = FRENCH, GERMAN
    m, out, offs = _curate(tmp_path, recs, {"steps": [{"language": {"keep": ["en"], "min_score": 0.65}}]})
    assert _removed_by_offset(out) == {offs[3]: ("language", "language_fr"), offs[8]: ("language", "language_de")}
    kept = read_output(out, m)
    assert [{k: v for k, v in r.items() if not k.startswith("language")} for r in kept] == \
        [r for i, r in enumerate(recs) if i not in (3, 8)]
    assert all(r["language"] == "en" and 0.65 < r["language_score"] <= 1.0 for r in kept)
    assert m["totals"]["removed"] == {"language": {"language_de": 1, "language_fr": 1}}


@pytest.mark.multiproc
def test_url_filter_removes_blocked_domains_subdomains_and_banned_words_only(tmp_path):
    recs = _good(10)
    (tmp_path / "blocked.txt").write_text("# blocked\nspam.example\nads.tracker.net\n")
    planted = {1: ("https://spam.example/a", "domain"), 2: ("http://deep.sub.spam.example/b?x=1", "domain"),
               4: ("https://ads.tracker.net/c", "domain"), 6: ("https://ok.example.com/casino-bonus", "banned_word"),
               7: (None, "missing_url")}
    for i, (url, _) in planted.items():
        if url is None:
            del recs[i]["url"]
        else:
            recs[i]["url"] = url
    recs[9]["url"] = "https://tracker.net/fine"  # the parent of a blocked subdomain is not blocked
    steps = {"steps": [{"url_filter": {"blocklist": str(tmp_path / "blocked.txt"), "banned_words": ["casino"]}}]}
    m, out, offs = _curate(tmp_path, recs, steps)
    assert _removed_by_offset(out) == {offs[i]: ("url_filter", why) for i, (_, why) in planted.items()}
    assert read_output(out, m) == [r for i, r in enumerate(recs) if i not in planted]


@pytest.mark.multiproc
def test_pii_masks_emails_and_public_ips_exactly_and_counts_them(tmp_path):
    recs = _good(6)
    base = recs[2]["text"]
    recs[2]["text"] = base + "\nWrite to jane.doe@mail.example.com or to x_y+z@corp.co.uk for the list."
    recs[4]["text"] = "Our server 8.8.8.8 answered, but 192.168.1.20 and 10.0.0.1 are private.\n" + recs[4]["text"]
    want = [dict(r) for r in recs]
    want[2]["text"] = base + "\nWrite to email@example.com or to email@example.com for the list."
    want[4]["text"] = want[4]["text"].replace("8.8.8.8", "0.0.0.0")
    m, out, _ = _curate(tmp_path, recs, {"steps": [{"pii": {}}]})
    assert read_output(out, m) == want
    assert m["totals"]["modified"] == {"pii": {"email": 2, "ip": 1}}
    assert m["totals"]["removed"] == {}


@pytest.mark.multiproc
def test_c4_drops_the_planted_lines_and_pages_and_nothing_else(tmp_path):
    recs = _good(9)
    texts = [r["text"] for r in recs]
    recs[1]["text"] = texts[1] + "\nPlease enable JavaScript to view the comments below."
    recs[2]["text"] = "Menu\n" + texts[2] + "\nRead our privacy policy before you sign up today."
    recs[3]["text"] = texts[3] + "\nToo short.\nA line that has no terminal punctuation at all"
    recs[4]["text"] = texts[4] + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit."
    recs[5]["text"] = texts[5] + "\nThe function body is { return 1; } as you can see."
    recs[6]["text"] = "One sentence here.\nAnd a second one.\nAnd a third one here."
    recs[7]["text"] = texts[7].replace(".", "[citation needed].", 1)  # as Wikipedia places them
    m, out, offs = _curate(tmp_path, recs, {"steps": [{"c4": {}}]})
    assert _removed_by_offset(out) == {offs[4]: ("c4", "lorem_ipsum"), offs[5]: ("c4", "curly_bracket"),
                                       offs[6]: ("c4", "too_few_sentences")}
    want = [dict(r, text=texts[i]) for i, r in enumerate(recs) if i not in (4, 5, 6)]
    assert read_output(out, m) == want  # the planted lines gone, the citation removed, every other line as it was
    assert m["totals"]["modified"] == {"c4": {"line_few_words": 1, "line_javascript": 1, "line_no_terminal_punct": 2,
                                              "line_policy": 1}}


@pytest.mark.multiproc
def test_fineweb_removes_each_planted_document_for_its_rule(tmp_path):
    recs = _good(10)
    p = Prose(5)
    long_words = ["extraordinarily", "comprehensively", "internationally", "notwithstanding", "unquestionably"]
    recs[1]["text"] = "\n".join(s.rstrip(".") for s in p.doc().split("\n"))  # no line ends in punctuation
    recs[3]["text"] = "\n".join([f"Item number {i} of the list." for i in range(20)] + [p.sentence()])
    recs[5]["text"] = p.doc() + "\n" + "\n".join([p.sentence()] * 2)  # one repeated line: > 1% of the characters
    recs[7]["text"] = "\n".join(f"{a} {b}." for a in long_words for b in long_words if a != b)  # 2 words a line
    m, out, offs = _curate(tmp_path, recs, {"steps": [{"fineweb": {}}]})
    assert _removed_by_offset(out) == {offs[1]: ("fineweb", "line_punct_ratio"), offs[3]: ("fineweb", "short_line_ratio"),
                                       offs[5]: ("fineweb", "char_dup_ratio"), offs[7]: ("fineweb", "list_ratio")}
    assert read_output(out, m) == [r for i, r in enumerate(recs) if i not in (1, 3, 5, 7)]


@pytest.mark.multiproc
def test_gopher_rules_added_and_published_definitions(tmp_path):
    """The five rules the kernels lack remove their planted documents in both modes; ``published`` counts duplicate
    lines as repeats, so a document whose 4 of 10 lines form 2 pairs is kept by it (2/10 <= 0.3) and removed by
    ours (4/10 > 0.3)."""
    p = Prose(9)
    recs = _good(8, seed=3)
    recs[1]["text"] = "\n".join("- " + p.sentence() for _ in range(10))
    recs[2]["text"] = "\n".join(p.sentence()[:-1] + "..." for _ in range(5)) + "\n" + p.doc(4)
    para = p.doc(3)
    recs[4]["text"] = "\n\n".join([para, p.doc(3), para, p.doc(3), para])
    lines = p.doc(8).split("\n")
    pair_a, pair_b = p.sentence(), p.sentence()
    recs[6]["text"] = "\n".join(lines[:3] + [pair_a, pair_b] + lines[3:6] + [pair_a, pair_b])
    off = {"dup_ngram_char_fraction": None, "top_ngram_char_fraction": None}
    m, out, offs = _curate(tmp_path, recs, {"steps": [{"quality": dict(off, definitions="published")}]})
    assert _removed_by_offset(out) == {offs[1]: ("quality", "bullet_lines"), offs[2]: ("quality", "ellipsis_lines"),
                                       offs[4]: ("quality", "duplicate_paragraphs")}
    (tmp_path / "ours").mkdir()
    m, out, offs = _curate(tmp_path / "ours", recs, {"steps": [{"quality": off}]})
    assert _removed_by_offset(out) == {offs[1]: ("quality", "bullet_lines"), offs[2]: ("quality", "ellipsis_lines"),
                                       offs[4]: ("quality", "duplicate_lines"), offs[6]: ("quality", "duplicate_lines")}


@pytest.mark.multiproc
def test_decontaminate_removes_the_document_holding_an_evaluation_passage(tmp_path):
    recs = _good(10)
    passage = ("Which of the following best explains why the moon shows phases to an observer standing on the "
               "surface of the Earth during a month")
    evals = tmp_path / "science_qa.jsonl"
    write_records(evals, [{"question": passage, "choices": ["its orbit", "clouds"], "answer": 0},
                          {"question": "A short one.", "choices": ["a", "b"]}])
    words = passage.split()
    recs[4]["text"] += "\nAs the quiz asked: " + " ".join(words[3:17]).upper() + "!"  # 14 words, case and punct differ
    recs[7]["text"] += "\n" + " ".join(words[:12]) + " and then something else entirely."  # 12 words: not 13
    steps = {"steps": [{"decontaminate": {"ngram": 13, "against": [str(evals)]}}]}
    m, out, offs = _curate(tmp_path, recs, steps)
    assert _removed_by_offset(out) == {offs[4]: ("decontaminate", "contaminated_science_qa")}
    assert read_output(out, m) == [r for i, r in enumerate(recs) if i != 4]


@pytest.mark.multiproc
def test_decontaminate_resolves_lm_eval_task_names_offline_and_refuses_uncached_data(tmp_path, monkeypatch):
    from data_prep.steps.decontaminate import task_source

    assert task_source("hellaswag") == ("Rowan/hellaswag", None, ("validation",))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"task 'hellaswag' reads Rowan/hellaswag, split validation, which is not in "
                                         r"the local Hugging Face datasets cache.*give a file"):
        _curate(tmp_path, _good(2), {"steps": [{"decontaminate": {"against": ["hellaswag"]}}]})
    assert not (tmp_path / "out" / "curation.json").exists()
    with pytest.raises(ValueError, match="'no_such_task_xyz' is neither a file nor an lm-eval task"):
        _curate(tmp_path, _good(2), {"steps": [{"decontaminate": {"against": ["no_such_task_xyz"]}}]})


PAGE = """<!doctype html><html><head><title>T</title><script>var tracking = "secret";</script>
<style>body {{ color: red }}</style></head><body>
<nav><a href="/">Home</a> <a href="/about">About us</a></nav>
<article><h1>The river and the bridge</h1>
<p>{p1}</p>
<p>{p2}</p></article>
<footer>Copyright 2024 Example Ltd. All rights reserved.</footer></body></html>"""


@pytest.mark.multiproc
def test_extract_html_keeps_the_article_text_and_drops_scripts_and_menus(tmp_path):
    p = Prose(4)
    p1, p2 = p.doc(3).replace("\n", " "), p.doc(3).replace("\n", " ")
    recs = _good(3) + [{"id": "page", "url": "https://x.example/p", "text": PAGE.format(p1=p1, p2=p2)},
                       {"id": "empty", "text": "<html><body><script>x()</script></body></html>"}]
    for r in recs[:3]:
        r["text"] = "<html><body><p>" + r["text"].replace("\n", "</p><p>") + "</p></body></html>"
    m, out, offs = _curate(tmp_path, recs, {"steps": [{"extract": {"from": "html"}}]})
    assert _removed_by_offset(out) == {offs[4]: ("extract", "no_text")}
    kept = read_output(out, m)
    assert [r["text"] for r in kept[:3]] == [r["text"].replace("\n", "\n\n") for r in _good(3)]  # a paragraph each
    assert [{k: v for k, v in r.items() if k != "text"} for r in kept] == \
        [{k: v for k, v in r.items() if k != "text"} for r in recs[:4]]
    page = kept[3]["text"]
    assert p1 in page and p2 in page and "The river and the bridge" in page
    assert "tracking" not in page and "color" not in page and "About us" not in page


def _warc_record(url, html, ctype="text/html; charset=utf-8"):
    body = html.encode("utf-8")
    http = (f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    head = (f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: {url}\r\nWARC-Date: 2024-01-02T03:04:05Z\r\n"
            f"WARC-Record-ID: <urn:uuid:{abs(hash(url)) % 10**8:08d}-0000-0000-0000-000000000000>\r\n"
            f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(http)}\r\n\r\n").encode()
    return head + http + b"\r\n\r\n"


@pytest.mark.multiproc
def test_extract_warc_reads_html_responses_with_their_url(tmp_path):
    p = Prose(6)
    texts = [p.doc(4) for _ in range(3)]
    pages = [(f"https://site{i}.example/a", "<html><body><p>" + t.replace("\n", "</p><p>") + "</p></body></html>")
             for i, t in enumerate(texts)]
    inp = tmp_path / "in"
    inp.mkdir()
    with gzip.open(inp / "crawl.warc.gz", "wb") as f:  # one gzip member for all (a member per record works too)
        f.write(_warc_record(*pages[0]) + _warc_record("https://img.example/x.png", "PNG", "image/png")
                + _warc_record(*pages[1]) + _warc_record(*pages[2]))
    m = run(CurateSettings(inputs=[str(inp)], output_dir=str(tmp_path / "out"),
                           steps={"steps": [{"extract": {"from": "warc"}}]}, workers=1, quiet=True))
    kept = read_output(tmp_path / "out", m)
    assert [(r["url"], r["text"]) for r in kept] == [(u, t.replace("\n", "\n\n")) for (u, _), t in zip(pages, texts)]
    assert all(r["date"] == "2024-01-02T03:04:05Z" and r["id"].startswith("<urn:uuid:") for r in kept)


@pytest.mark.unit
def test_tokenize_steps_refuses_steps_that_rewrite_and_span_steps_come_last():
    from data_prep.curate import context

    steps = parse_steps({"steps": [{"pii": {}}, {"exact_dedup": {}}]})
    with pytest.raises(StepListError, match="tokenize --steps: step.s. pii rewrite documents"):
        context("/tmp/x", steps, [], "text", 1, 1)
    with pytest.raises(StepListError, match="sentence_dedup must come after every other dedup step"):
        parse_steps({"steps": [{"sentence_dedup": {}}, {"exact_dedup": {}}]})
    with pytest.raises(StepListError, match="one span dedup step"):
        parse_steps({"steps": [{"sentence_dedup": {}}, {"substring_dedup": {}}]})
    with pytest.raises(StepListError, match=r"steps\[0\]\.extract: from: Input should be 'html' or 'warc'"):
        parse_steps({"steps": [{"extract": {"from": "pdf"}}]})


@pytest.mark.multiproc
def test_carried_doc_step_outcomes_give_the_bytes_of_evaluating_them_again(tmp_path, caplog):
    """The hash pass's per-document removals are reused by the filter pass (the steps before the removing one are
    not evaluated again); with the carried file changed, every step runs again, and the output is the same."""
    from tests.support.data_prep import tree_bytes

    from data_prep.steps import doc_steps

    recs = _good(40)
    for i in (3, 11, 29):
        recs[i]["text"] = FRENCH
    for i in (5, 17):
        recs[i]["text"] = "\n".join(s.rstrip(".") for s in recs[i]["text"].split("\n"))
    steps = {"steps": [{"language": {}}, {"pii": {}}, {"fineweb": {}}, {"exact_dedup": {}}], "buckets": 2}
    calls = []
    real = doc_steps.build

    def counting(step):
        s = real(step)
        apply = s.apply
        s.apply = lambda doc: calls.append(step.kind) or apply(doc)
        return s

    doc_steps.build = counting
    try:
        m, out, offs = _curate(tmp_path, recs, steps, workers=1)
        hash_calls = len(calls)
        assert _removed_by_offset(out) == {**{offs[i]: ("language", "language_fr") for i in (3, 11, 29)},
                                           **{offs[i]: ("fineweb", "line_punct_ratio") for i in (5, 17)}}
        (tmp_path / "b").mkdir()
        for p in (out / "dedup").glob("doc_steps_*.npy"):
            p.write_bytes(p.read_bytes()[:-4] + b"\0\0\0\0")  # changed: its SHA-256 no longer matches the marker
        calls.clear()
        import shutil

        shutil.copytree(out, tmp_path / "b" / "out")
        for p in (tmp_path / "b" / "out").glob("shard_*.curated.json"):
            p.unlink()
        with caplog.at_level("WARNING"):
            run(CurateSettings(inputs=[str(tmp_path / "in")], output_dir=str(tmp_path / "b" / "out"), steps=steps,
                               workers=1, shard_size=4000, quiet=True))
    finally:
        doc_steps.build = real
    assert "evaluating the per-document steps again" in caplog.text
    assert {k: v for k, v in tree_bytes(tmp_path / "b" / "out").items() if not k.startswith("dedup")} == \
        {k: v for k, v in tree_bytes(out).items() if not k.startswith("dedup")}
    # carried: the filter pass ran language and pii on the 35 documents kept, fineweb on none (passed in the hash
    # pass); the 5 removed ones ran nothing there
    assert hash_calls == 40 + 37 + 37 + 35 + 35  # hash pass: language 40, pii 37, fineweb 37; filter: 35 + 35


@pytest.mark.multiproc
def test_an_edited_list_or_evaluation_file_redoes_a_finished_run(tmp_path):
    """The files the steps read are part of the run's fingerprint: a rerun after editing one is not skipped."""
    recs = _good(6)
    evals = tmp_path / "evals.txt"
    evals.write_text("nothing in common with the corpus at all, not one thirteen word run of it here")
    steps = {"steps": [{"decontaminate": {"against": [str(evals)]}}, {"exact_dedup": {}}], "buckets": 2}
    m, out, offs = _curate(tmp_path, recs, steps)
    assert m["totals"]["removed"] == {}
    evals.write_text(recs[2]["text"].split("\n")[1])  # now one sentence of a document: it is contaminated
    m2 = run(CurateSettings(inputs=[str(tmp_path / "in")], output_dir=str(out), steps=steps, workers=2,
                            shard_size=4000, quiet=True))
    assert m2["totals"]["removed"] == {"decontaminate": {"contaminated_evals": 1}}
    assert _removed_by_offset(out) == {offs[2]: ("decontaminate", "contaminated_evals")}
