"""``url_filter``: documents removed by their record's URL (``url_field``, default ``url``), the checks of datatrove's
URLFilter on lists the user gives (nothing is downloaded, no list is bundled).

Reasons, in the order checked: ``domain`` (the URL's host or one of its parent domains is in ``blocklist``:
``example.com`` blocks ``a.example.com`` too), ``url`` (the whole URL is in ``blocked_urls``), ``banned_word`` (a
word of the URL, split at every non-alphanumeric character and lower-cased, is in ``banned_words``),
``soft_banned_words`` (``soft_word_threshold`` or more of ``soft_banned_words``), ``banned_subword`` (a
``banned_subwords`` entry occurs in the URL with its non-alphanumerics removed), ``missing_url`` (the record has no
URL; kept instead when ``missing: keep``). List files: one entry per line, ``#`` starts a comment.
"""

from __future__ import annotations

import re
from typing import List, Literal, Optional
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from data_prep.steps.doc_steps import Doc, DocStep

_NON_ALNUM = re.compile(r"[^a-zA-Z0-9]+")


class UrlFilterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url_field: str = "url"
    blocklist: Optional[str] = Field(None, description="file of blocked domains (subdomains included)")
    domains: List[str] = Field(default_factory=list, description="blocked domains, inline")
    blocked_urls: Optional[str] = Field(None, description="file of blocked URLs (exact)")
    banned_words: List[str] = Field(default_factory=list)
    soft_banned_words: List[str] = Field(default_factory=list)
    soft_word_threshold: int = Field(2, ge=1)
    banned_subwords: List[str] = Field(default_factory=list)
    missing: Literal["remove", "keep"] = "remove"


def read_list(path: str, what: str) -> List[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    except OSError as e:
        raise ValueError(f"url_filter.{what}: cannot read {path} ({e.strerror}); give a file with one entry per "
                         "line") from None


def _words(url: str) -> set:
    return {w.lower() for w in _NON_ALNUM.split(url) if w}


class UrlFilter(DocStep):
    needs_record = True

    def __init__(self, cfg: UrlFilterConfig):
        super().__init__(cfg)
        domains = cfg.domains + (read_list(cfg.blocklist, "blocklist") if cfg.blocklist else [])
        self.domains = frozenset(d.lower().strip(".") for d in domains)
        self.urls = frozenset(read_list(cfg.blocked_urls, "blocked_urls") if cfg.blocked_urls else [])
        self.banned = frozenset(_NON_ALNUM.sub("", w).lower() for w in cfg.banned_words)
        self.soft = frozenset(_NON_ALNUM.sub("", w).lower() for w in cfg.soft_banned_words)
        self.subwords = [_NON_ALNUM.sub("", w).lower() for w in cfg.banned_subwords]
        # one regex for every banned subword: a C scan of the URL instead of a Python loop over the list
        self.subword_re = re.compile("|".join(map(re.escape, sorted(self.subwords)))) if self.subwords else None

    def _blocked_host(self, url: str) -> bool:
        try:
            host = (urlsplit(url if "//" in url else "//" + url).hostname or "").rstrip(".")
        except ValueError:
            return False
        parts = host.split(".")
        return any(".".join(parts[i:]) in self.domains for i in range(len(parts)))

    def apply(self, doc: Doc) -> Optional[str]:
        url = (doc.record or {}).get(self.cfg.url_field)
        if not isinstance(url, str) or not url:
            return "missing_url" if self.cfg.missing == "remove" else None
        if self.domains and self._blocked_host(url):
            return "domain"
        if url in self.urls:
            return "url"
        if self.banned or self.soft:
            words = _words(url)
            if not self.banned.isdisjoint(words):
                return "banned_word"
            if self.soft and len(self.soft & words) >= self.cfg.soft_word_threshold:
                return "soft_banned_words"
        if self.subword_re is not None and self.subword_re.search(_NON_ALNUM.sub("", url).lower()):
            return "banned_subword"
        return None
