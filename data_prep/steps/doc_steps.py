"""Per-document curation steps: filters that remove a document and formatters that rewrite its text, one document in,
a decision out, with no state shared between documents (language, url_filter, pii, c4, fineweb, quality with
``definitions: published``, decontaminate, extract).

A step's ``apply(doc)`` returns the reason it removes the document, or None; it may rewrite ``doc.text`` (lines
dropped, PII masked, HTML extracted) and add fields to ``doc.fields`` (language, score), which the kept record
carries. What a step rewrites it counts in ``modified`` ({reason: occurrences}: lines dropped, emails masked), which
the unit's stats and the manifest report beside the removals. Steps are deterministic: the hash pass (before a dedup
step) and the filter pass apply them to the same text and reach the same decision.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Dict, Optional


class Doc:
    """One document on its way through the steps: its text (as rewritten so far), its input record (for steps that
    read another field, e.g. the URL) and the fields the steps add."""

    __slots__ = ("text", "record", "fields")

    def __init__(self, text: str, record: Optional[dict] = None):
        self.text, self.record, self.fields = text, record, None

    def add_fields(self, **fields) -> None:
        if self.fields is None:
            self.fields = {}
        self.fields.update(fields)


class DocStep:
    """Base of the per-document steps. ``needs_record``: the step reads the input record (the hash pass then reads
    whole records too)."""

    needs_record = False

    def __init__(self, cfg):
        self.cfg = cfg
        self.modified: Counter = Counter()

    def apply(self, doc: Doc) -> Optional[str]:
        raise NotImplementedError


def _builders() -> Dict[str, Callable]:
    """kind -> the DocStep class (imported here, lazily: a run pays only for the libraries its steps use)."""
    from data_prep.steps import decontaminate, extract, language, pii, published, url_filter, web_rules

    return {"language": language.LanguageFilter, "url_filter": url_filter.UrlFilter, "pii": pii.PiiMasker,
            "c4": web_rules.C4Filter, "fineweb": web_rules.FineWebFilter, "quality": published.PublishedQuality,
            "decontaminate": decontaminate.Decontaminate, "extract": extract.Extractor}


def build(step) -> DocStep:
    """The DocStep of a Step (step_list.Step) that runs per document."""
    return _builders()[step.kind](step.cfg)


def is_doc_step(step) -> bool:
    """Per-document steps: every kind but the dedup kinds and the compiled quality rules (``definitions: ours``)."""
    from data_prep.steps.step_list import DEDUP_KINDS

    if step.kind in DEDUP_KINDS:
        return False
    return step.kind != "quality" or step.cfg.definitions == "published"
