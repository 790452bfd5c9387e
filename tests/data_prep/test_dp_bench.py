"""`python -m data_prep bench` on a tiny corpus: every family measured (ours, bare gigatoken, the bare library),
and its figures true: ours and the bare library count the corpus's tokens as the family's tokenizer does through its
own library, counted here (bare gigatoken may differ: then the bench says so); the summary's seconds are the runs'
and its speed-ups their quotients."""

import re

import orjson
import pytest
from tests.support.data_prep import run_cli

from data_prep.tools.bench import FAMILIES

pytestmark = pytest.mark.multiproc

ROW = re.compile(r"^   (\S.*?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(?:[\d.]+|-)\s+([\d,]+)$", re.M)


def _library_tokens(corpus: str, tokenizer: str) -> int:
    """Tokens of the corpus's documents by the tokenizer's own library, plus the EOD the pipeline appends to each."""
    with open(corpus, "rb") as f:
        texts = [orjson.loads(line)["text"] for line in f]
    if tokenizer.endswith(".model"):
        import sentencepiece as spm

        ids = spm.SentencePieceProcessor(model_file=tokenizer).encode(texts)
    else:
        from tokenizers import Tokenizer

        ids = [e.ids for e in Tokenizer.from_file(tokenizer).encode_batch(texts, add_special_tokens=False)]
    return sum(len(x) + 1 for x in ids)


def _is_quotient(cell: str, theirs: tuple[float, float], ours: tuple[float, float]) -> bool:
    """A summary cell "W x; C x" is theirs / ours (wall; cpu) of the seconds the rows print, up to the rounding of
    each printed figure to 0.01."""
    printed = map(float, re.fullmatch(r"([\d.]+)x; ([\d.]+)x", cell).groups())
    return all((t - 0.005) / (o + 0.005) - 0.005 <= q <= (t + 0.005) / max(o - 0.005, 1e-9) + 0.005
               for q, t, o in zip(printed, theirs, ours, strict=True))


def test_bench_figures_are_the_runs_and_the_token_counts_the_corpus(tmp_path):
    r = run_cli("bench", tmp_path / "b", "--corpus-mb", "0.4", "--scale", "2", "-j", "1", "--vocab-size", "700",
                timeout=600)
    out = r.stdout
    corpus = re.search(r"^bench: .*corpus [\d.]+ MB of web-page-sized documents \((\S+)\)", out, re.M).group(1)
    rows = {line.split(" | ")[0][2:]: [c.strip() for c in line.strip("|").split("|")]
            for line in out.splitlines() if line.startswith("| ") and not line.startswith("| family")}
    assert list(rows) == list(FAMILIES), out[-2000:]
    for family in FAMILIES:
        head, section = out.split(f"-- {family}: ours encodes with ", 1)[1].split("\n", 1)
        section = section.split("\n-- ", 1)[0].split("\n\n|", 1)[0]
        tokenizer = re.fullmatch(r"(\S+) \((\S+)\)", head).group(2)
        runs = {m.group(1): (float(m.group(2)), float(m.group(3)), int(m.group(5).replace(",", "")))
                for m in ROW.finditer(section)}
        assert {"bare", "ours", "ours, 2x corpus"} <= set(runs), (family, section[:600])
        want = _library_tokens(corpus, tokenizer)
        assert runs["ours"][2] == runs["bare"][2] == want, (family, runs, want)  # the library's ids
        if "gigatoken" in runs:  # bare gigatoken may differ from the library (a finding the bench notes, not ours)
            differs = runs["gigatoken"][2] != want
            assert differs == (f"note: gigatoken gives {runs['gigatoken'][2]:,} tokens" in section), (family, section)
        cells = rows[family]
        seconds = lambda cell: tuple(map(float, re.fullmatch(r"([\d.]+) \(([\d.]+)\)", cell).groups()))  # noqa
        ours, bare = seconds(cells[2]), seconds(cells[4])
        assert ours == runs["ours"][:2] and bare == runs["bare"][:2], (family, cells, runs)
        assert _is_quotient(cells[8], bare, ours), (family, cells[8], bare, ours)
        if "gigatoken" in runs:
            assert _is_quotient(cells[7], runs["gigatoken"][:2], ours), (family, cells[7], runs["gigatoken"], ours)
        assert cells[5] == cells[6] == "-" and re.fullmatch(r"\d+ MB -> \d+ MB \([\d.]+\)", cells[11])
    assert "token counts differ" not in out


@pytest.mark.parametrize("args,message", [(["--megatron-lm", "/nonexistent/Megatron-LM"], "no tools/preprocess_data.py"),
                                          (["--megatron-lm-fast", "/nonexistent/Megatron-LM"],
                                           "no tools/preprocess_data_fast.py"),
                                          (["--family", "wordpiece"], "unknown family")])
def test_bench_refuses_bad_options_before_any_work(tmp_path, args, message):
    r = run_cli("bench", tmp_path / "b", *args, check=False)
    assert r.returncode == 2 and message in r.stderr
    assert not (tmp_path / "b" / "corpus_1x").exists()
