"""The C4 and FineWeb rule sets, as published (Raffel et al. 2020, section 2.2 and the C4 reference code; Penedo et
al. 2024, FineWeb's custom filters) and as datatrove's C4QualityFilter / FineWebQualityFilter count them, with
whitespace words and a rule-based sentence count where datatrove uses spaCy.

``c4`` rewrites: lines are stripped and dropped one by one (reasons counted under ``modified``:
``line_long_word``, ``line_no_terminal_punct``, ``line_few_words``, ``line_javascript``, ``line_policy``), the kept
lines joined by newlines; the document is removed for ``lorem_ipsum``, ``curly_bracket`` (found in a line that
reached that check, as the reference code does), ``bad_words`` (a word of ``bad_words``, a local file: nothing is
downloaded) or ``too_few_sentences`` (counted over the kept lines). ``fineweb`` removes documents:
``line_punct_ratio``, ``short_line_ratio``, ``char_dup_ratio``, ``list_ratio`` (and ``empty``).
"""

from __future__ import annotations

import functools
import re
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from data_prep.steps.doc_steps import Doc, DocStep

CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
C4_END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY_SUBSTRINGS = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies",
                     "use cookies")
# a sentence ends at a run of . ! ? (closing quotes or brackets after it) before whitespace or the end
SENTENCE_END = re.compile(r"[.!?\u3002\uff01\uff1f]+[\"'\u201d\u2019)\]]*(?=\s|$)")
_WORD_SPLIT = re.compile(r"[^\w]+")


@functools.lru_cache(maxsize=None)
def sentence_terminals() -> tuple:
    """Every character with Unicode's Sentence_Terminal property (the set FineWeb's line rule ends lines with)."""
    import regex

    return tuple(regex.findall(r"\p{Sentence_Terminal}", "".join(map(chr, range(0x110000)))))


def count_sentences(line: str) -> int:
    return len(SENTENCE_END.findall(line)) or 1


class C4Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    remove_citations: bool = True
    filter_no_terminal_punct: bool = True
    min_num_sentences: Optional[int] = Field(5, ge=0)
    min_words_per_line: Optional[int] = Field(3, ge=0)
    max_word_length: Optional[int] = Field(1000, ge=1)
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True
    bad_words: Optional[str] = Field(None, description="a local file of bad words (one per line): a document with "
                                                       "one is removed")


class C4Filter(DocStep):
    def __init__(self, cfg: C4Config):
        super().__init__(cfg)
        self.bad = None
        if cfg.bad_words:
            from data_prep.steps.url_filter import read_list

            self.bad = frozenset(w.lower() for w in read_list(cfg.bad_words, "bad_words"))

    def _line_reason(self, line: str, words: list) -> Optional[str]:
        """Why a stripped line is dropped (None: kept); the document-level findings are raised as _Remove."""
        c = self.cfg
        if c.max_word_length is not None and any(len(w) > c.max_word_length for w in words):
            return "line_long_word"
        if c.filter_no_terminal_punct and (not line.endswith(C4_END_PUNCTUATION) or line.endswith("...")):
            return "line_no_terminal_punct"
        if c.min_words_per_line is not None and len(words) < c.min_words_per_line:
            return "line_few_words"
        low = line.lower()
        if c.filter_lorem_ipsum and "lorem ipsum" in low:
            raise _Remove("lorem_ipsum")
        if c.filter_javascript and "javascript" in low:
            return "line_javascript"
        if c.filter_curly_bracket and "{" in line:
            raise _Remove("curly_bracket")
        if c.filter_policy and any(p in low for p in POLICY_SUBSTRINGS):
            return "line_policy"
        return None

    def apply(self, doc: Doc) -> Optional[str]:
        kept, dropped, sentences = [], [], 0
        need = self.cfg.min_num_sentences or 0
        try:
            for line in doc.text.splitlines():
                line = line.strip()
                words = line.split()
                if self.cfg.remove_citations and "[" in line:
                    line = CITATION.sub("", line)
                why = self._line_reason(line, words)
                if why is not None:
                    dropped.append(why)
                    continue
                if sentences < need:  # counted only up to the threshold: the rule asks "at least"
                    sentences += count_sentences(line)
                kept.append(line)
        except _Remove as r:
            return r.reason
        if self.cfg.min_num_sentences is not None and sentences < self.cfg.min_num_sentences:
            return "too_few_sentences"
        text = "\n".join(kept).strip()
        if self.bad is not None and not self.bad.isdisjoint(_WORD_SPLIT.split(text.lower())):
            return "bad_words"
        self.modified.update(dropped)  # counted only for documents kept: the lines that left a kept document
        doc.text = text
        return None


class _Remove(Exception):
    def __init__(self, reason: str):
        self.reason = reason


class FineWebConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    line_punct_thr: Optional[float] = Field(0.12, ge=0, le=1)
    line_punct_exclude_zero: bool = False
    short_line_thr: Optional[float] = Field(0.67, ge=0, le=1)
    short_line_length: int = Field(30, ge=0)
    char_duplicates_ratio: Optional[float] = Field(0.01, ge=0, le=1)
    new_line_ratio: Optional[float] = Field(0.3, ge=0)


def duplicate_elements(items) -> "tuple[int, int]":
    """(elements seen before, their characters): the second and later occurrences of each, as Gopher and FineWeb
    count duplicates (the first occurrence is not a duplicate)."""
    seen, n, chars = set(), 0, 0
    for x in items:
        if x in seen:
            n += 1
            chars += len(x)
        else:
            seen.add(x)
    return n, chars


class FineWebFilter(DocStep):
    def __init__(self, cfg: FineWebConfig):
        super().__init__(cfg)
        self.stop = frozenset(sentence_terminals())  # one character each: a line's last one is looked up

    def apply(self, doc: Doc) -> Optional[str]:
        c, text = self.cfg, doc.text
        lines = [ln for ln in text.split("\n") if ln.strip()]
        if not lines:
            return "empty"
        if c.line_punct_thr is not None:
            stop = self.stop
            ratio = sum(ln[-1] in stop for ln in lines) / len(lines)
            if ratio < c.line_punct_thr and not (ratio == 0 and c.line_punct_exclude_zero):
                return "line_punct_ratio"
        if c.short_line_thr is not None and \
                sum(1 for ln in lines if len(ln) <= c.short_line_length) / len(lines) > c.short_line_thr:
            return "short_line_ratio"
        if c.char_duplicates_ratio is not None:
            chars = len(text) - text.count("\n")
            if chars and duplicate_elements(lines)[1] / chars > c.char_duplicates_ratio:
                return "char_dup_ratio"
        if c.new_line_ratio is not None:
            words = len(text.split())
            if words and text.count("\n") / words > c.new_line_ratio:
                return "list_ratio"
        return None
