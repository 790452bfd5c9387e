"""Side by side with datatrove: the same documents and rules through both, per step, in one process each (CPU time).

`python -m data_prep bench-datatrove CORPUS.jsonl` (datatrove installed beside this project: it is not one of its
dependencies, and the command says so when it is missing). For each step, the documents' text through this
project's step and through datatrove's filter (or formatter) of the same rules:

| step | ours | datatrove |
|---|---|---|
| gopher | ``quality`` (the kernels; and ``definitions: published``) | GopherRepetitionFilter + GopherQualityFilter |
| c4 | ``c4`` | C4QualityFilter |
| fineweb | ``fineweb`` | FineWebQualityFilter |
| pii | ``pii`` | PIIFormatter (one placeholder each, as ours) |
| language | ``language`` | LanguageFilter (its fastText model given the same lid.176.ftz file) |

datatrove runs twice: with its default word tokenizer (spaCy's, for English) on the first ``--default-words-mb`` of the
corpus (it is slow), and with whitespace words (and sentences cut as ours are) on all of it. Printed per step: CPU
MB/s per core of each (input text bytes over CPU seconds; each tool's set-up, model loads and imports outside the
clock) and the agreement of the kept sets (Jaccard of kept document indices; rewriting steps: of the (index, text)
pairs kept, so a different rewrite counts as a disagreement).
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

import orjson



def _texts(corpus: str, max_bytes: int) -> List[str]:
    out, size = [], 0
    with open(corpus, "rb") as f:
        for line in f:
            t = orjson.loads(line).get("text")
            if isinstance(t, str) and t.strip():
                out.append(t)
                size += len(t.encode("utf-8", "surrogatepass"))
                if size >= max_bytes:
                    break
    return out


def _whitespace_tokenizer():
    """A datatrove WordTokenizer with whitespace words and sentences cut where ours are (web_rules.SENTENCE_END:
    datatrove then counts max(1, sentence ends) sentences in a line, as web_rules.count_sentences does)."""
    from datatrove.utils.word_tokenizers import WordTokenizer

    from data_prep.steps.web_rules import SENTENCE_END

    class Whitespace(WordTokenizer):
        def word_tokenize(self, text):
            return text.split()

        def span_tokenize(self, text):
            ends = [m.end() for m in SENTENCE_END.finditer(text)]
            return list(zip([0] + ends[:-1], ends))

        def sent_tokenize(self, text):
            return [text[a:b] for a, b in self.span_tokenize(text)]

    return Whitespace("en")


def _run_ours(texts: List[str], step) -> tuple:
    """(CPU seconds, kept: {index: text})."""
    from data_prep.steps.doc_steps import Doc

    kept = {}
    t0 = time.process_time()
    for i, t in enumerate(texts):
        d = Doc(t)
        if step(d) is None:
            kept[i] = d.text
    return time.process_time() - t0, kept


def _run_datatrove(texts: List[str], blocks: List) -> tuple:
    from datatrove.data import Document

    docs = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    kept = {}
    t0 = time.process_time()
    for i, d in enumerate(docs):
        ok = True
        for b in blocks:
            if hasattr(b, "filter"):
                res = b.filter(d)
                if not (res[0] if isinstance(res, tuple) else res):
                    ok = False
                    break
            else:
                d.text = b.format(d.text)
        if ok:
            kept[i] = d.text
    return time.process_time() - t0, kept


def _jaccard(a: dict, b: dict) -> float:
    sa, sb = set(a.items()), set(b.items())
    return len(sa & sb) / max(len(sa | sb), 1)


def _ours(kind: str, cfg: dict) -> Callable:
    from data_prep.steps import doc_steps
    from data_prep.steps.filters import QualityConfig, QualityFilter
    from data_prep.steps.step_list import parse_steps

    step = parse_steps({"steps": [{kind: cfg}]}).steps[0]
    if kind == "quality" and step.cfg.definitions == "ours":
        qf = QualityFilter(QualityConfig(**cfg))
        return lambda d: qf.check(d.text)
    return doc_steps.build(step).apply


GOPHER = {"max_digit_fraction": None, "min_punctuation_line_fraction": None}  # ours only: not Gopher's rules


class _NumpyScores:
    """fasttext-predict's model with official fastText's return type (scores as a numpy array), which datatrove
    expects."""

    def __init__(self, model):
        self.model = model

    def predict(self, text, k=1):
        import numpy as np

        labels, scores = self.model.predict(text, k=k)
        return labels, np.asarray(scores)


def _datatrove_blocks(words) -> Dict[str, Callable]:
    from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                            GopherRepetitionFilter, LanguageFilter)
    from datatrove.pipeline.formatters import PIIFormatter

    def language():
        from data_prep.steps.language import load_model

        # its dependency check asks for the fasttext package by name; fasttext-predict provides the same module
        LanguageFilter._requires_dependencies = ["fasteners"]
        lf = LanguageFilter(languages=["en"], language_threshold=0.65)
        lf.model._model = _NumpyScores(load_model(None))  # the same lid.176.ftz: nothing downloaded
        return [lf]

    lang = {} if words is None else {"language": words}
    return {"gopher": lambda: [GopherRepetitionFilter(**lang), GopherQualityFilter(**lang)],
            "c4": lambda: [C4QualityFilter(**lang)],
            "fineweb": lambda: [FineWebQualityFilter(**lang)],
            "pii": lambda: [PIIFormatter(email_replacement="email@example.com", ip_replacement="0.0.0.0")],
            "language": language}


STEPS = {  # name -> [(label, our step kind, its config)]
    "gopher": [("ours", "quality", GOPHER), ("published", "quality", dict(GOPHER, definitions="published"))],
    "c4": [("ours", "c4", {})],
    "fineweb": [("ours", "fineweb", {})],
    "pii": [("ours", "pii", {})],
    "language": [("ours", "language", {"keep": ["en"], "min_score": 0.65})],
}


def bench_datatrove(corpus: str, max_mb: float = 16.0, default_words_mb: float = 1.0,
                    steps: Optional[List[str]] = None) -> List[dict]:
    try:
        import datatrove  # noqa: F401
    except ImportError:
        raise SystemExit("bench-datatrove: datatrove is not installed (it is not a dependency of this project): "
                         "`pip install datatrove==0.10.1 spacy` in a scratch environment, then rerun") from None
    texts = _texts(corpus, int(max_mb * (1 << 20)))
    small = _texts(corpus, int(default_words_mb * (1 << 20)))
    mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
    small_mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in small) / 1e6
    ws, rows = _datatrove_blocks(_whitespace_tokenizer()), []
    default = _datatrove_blocks(None)
    for name in steps or list(STEPS):
        ws_blocks, dflt_blocks = ws[name](), default[name]()
        _run_datatrove(small[:3], dflt_blocks)  # spaCy's pipeline built, the model loaded: outside the clock
        dt_ws_s, dt_ws_kept = _run_datatrove(texts, ws_blocks)
        dt_s, dt_kept = _run_datatrove(small, dflt_blocks)
        for label, kind, cfg in STEPS[name]:
            fn = _ours(kind, cfg)
            fn(__import__("data_prep.steps.doc_steps", fromlist=["Doc"]).Doc(small[0]))  # warm (kernels, model)
            our_s, our_kept = _run_ours(texts, fn)
            _, our_small = _run_ours(small, fn)
            rows.append({"step": name, "ours": label, "docs": len(texts), "mb": round(mb, 2),
                         "ours_mb_s": mb / our_s, "datatrove_ws_mb_s": mb / dt_ws_s,
                         "datatrove_default_mb_s": small_mb / dt_s, "vs_ws": dt_ws_s / our_s,
                         "vs_default": (dt_s / small_mb) / (our_s / mb),
                         "jaccard_ws": _jaccard(our_kept, dt_ws_kept), "jaccard_default": _jaccard(our_small, dt_kept),
                         "kept_ours": len(our_kept), "kept_datatrove_ws": len(dt_ws_kept)})
    _print(rows, mb, small_mb)
    return rows


def _print(rows: List[dict], mb: float, small_mb: float) -> None:
    print(f"CPU MB/s per core (one process each); whitespace words: {mb:.1f} MB, datatrove's default (spaCy) words: "
          f"the first {small_mb:.1f} MB")
    print("| step | ours | ours MB/s | datatrove ws MB/s | x | datatrove default MB/s | x | kept Jaccard ws | "
          "kept Jaccard default |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['step']} | {r['ours']} | {r['ours_mb_s']:.1f} | {r['datatrove_ws_mb_s']:.2f} | {r['vs_ws']:.1f} | "
              f"{r['datatrove_default_mb_s']:.2f} | {r['vs_default']:.0f} | {r['jaccard_ws']:.4f} | "
              f"{r['jaccard_default']:.4f} |")
