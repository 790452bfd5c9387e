"""The step list of a curation run, from YAML: filters, formatters and dedup steps applied in order.

    steps:                      # in order; a document removed by one step is not seen by the later ones
      - extract: {from: html}     # HTML -> text (steps/extract.py; ``warc`` for WARC inputs)
      - url_filter: {blocklist: domains.txt}
      - language: {keep: [en], min_score: 0.65}
      - quality: {min_words: 50}  # Gopher heuristics (steps/filters.py); omitted fields keep their defaults,
                                  # null turns a rule off; definitions: published = Gopher's/datatrove's counting
      - c4: {}                    # C4's line filters (drop lines) and page rules (steps/web_rules.py)
      - fineweb: {}               # FineWeb's custom filters
      - pii: {email: mask, ip: mask}
      - decontaminate: {ngram: 13, against: [hellaswag, evals.jsonl]}
      - exact_dedup: {}           # content hash, global over all units and nodes (steps/dedup.py)
      - minhash_dedup: {threshold: 0.8, num_perm: 128, shingle_words: 5}
      - sentence_dedup: {}        # repeated 3-sentence spans removed from documents (steps/span_dedup.py)
      - substring_dedup: {min_words: 50}
    buckets: 64                 # hash partitions of the dedup passes (one bucket-pass task each)

Each step has a ``name`` (default: its kind) that the manifest counts and the removal log use. Errors name the file,
the step and the field, and say what is accepted.
"""

from __future__ import annotations

from typing import List, Optional, Union

import yaml
from pydantic import BaseModel, ValidationError

from data_prep.steps.decontaminate import DecontaminateConfig
from data_prep.steps.dedup import ExactDedupConfig, MinHashDedupConfig
from data_prep.steps.extract import ExtractConfig
from data_prep.steps.filters import QualityConfig
from data_prep.steps.language import LanguageConfig
from data_prep.steps.pii import PiiConfig
from data_prep.steps.span_dedup import SentenceDedupConfig, SubstringDedupConfig
from data_prep.steps.url_filter import UrlFilterConfig
from data_prep.steps.web_rules import C4Config, FineWebConfig

KINDS = {"quality": QualityConfig, "exact_dedup": ExactDedupConfig, "minhash_dedup": MinHashDedupConfig,
         "language": LanguageConfig, "url_filter": UrlFilterConfig, "pii": PiiConfig, "c4": C4Config,
         "fineweb": FineWebConfig, "decontaminate": DecontaminateConfig, "extract": ExtractConfig,
         "sentence_dedup": SentenceDedupConfig, "substring_dedup": SubstringDedupConfig}
DEDUP_KINDS = ("exact_dedup", "minhash_dedup", "sentence_dedup", "substring_dedup")
SPAN_KINDS = ("sentence_dedup", "substring_dedup")  # dedup that removes repeated spans, not documents
# Steps that rewrite a document's text or read another field of its record: curate runs them, tokenize --steps
# (which reads the text alone and tokenizes what the gate keeps) refuses them.
REWRITING_KINDS = ("pii", "c4", "extract", "url_filter") + SPAN_KINDS
DEFAULT_BUCKETS = 64


class Step:
    def __init__(self, kind: str, name: str, cfg: BaseModel):
        self.kind, self.name, self.cfg = kind, name, cfg

    @property
    def is_dedup(self) -> bool:
        return self.kind in DEDUP_KINDS

    @property
    def is_span_dedup(self) -> bool:
        return self.kind in SPAN_KINDS

    def as_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "config": self.cfg.model_dump(mode="json", by_alias=True)}


class StepList:
    def __init__(self, steps: List[Step], buckets: int = DEFAULT_BUCKETS):
        self.steps, self.buckets = steps, buckets

    @property
    def dedup_steps(self) -> List[Step]:
        return [s for s in self.steps if s.is_dedup]

    def resource_files(self) -> List[str]:
        """The files the steps read (lists, evaluation sets, a model): their content is part of the run's
        fingerprint, so an edited list redoes the work a rerun would otherwise skip."""
        import os

        out = []
        for st in self.steps:
            c = st.cfg
            for field in ("blocklist", "blocked_urls", "bad_words", "model"):
                path = getattr(c, field, None)
                if isinstance(path, str):
                    out.append(path)
            if st.kind == "decontaminate":
                out += [a for a in c.against if os.path.exists(a)]
        return out

    def check_tokenize(self) -> None:
        """tokenize --steps takes the steps that only remove whole documents judged on their text."""
        bad = [s.name for s in self.steps if s.kind in REWRITING_KINDS]
        if bad:
            raise StepListError(f"tokenize --steps: step(s) {', '.join(bad)} rewrite documents or read fields other "
                                "than the text; run `data_prep curate` with this step list, then tokenize its output")

    def as_dict(self) -> dict:
        """What the fingerprint and the manifest record: every threshold, defaults filled in."""
        return {"steps": [s.as_dict() for s in self.steps], "buckets": self.buckets}


class StepListError(ValueError):
    pass


def parse_steps(doc, where: str = "steps") -> StepList:
    """A parsed YAML document (dict with ``steps``, or a bare list) -> StepList; StepListError names the field."""
    if isinstance(doc, list):
        doc = {"steps": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list) or not doc["steps"]:
        raise StepListError(f"{where}: expected a mapping with a non-empty 'steps' list, e.g.\n"
                            "steps:\n  - quality: {}\n  - exact_dedup: {}")
    unknown = set(doc) - {"steps", "buckets"}
    if unknown:
        raise StepListError(f"{where}: unknown top-level key(s) {sorted(unknown)}; allowed: steps, buckets")
    buckets = doc.get("buckets", DEFAULT_BUCKETS)
    if not isinstance(buckets, int) or isinstance(buckets, bool) or not 1 <= buckets <= 65536:
        raise StepListError(f"{where}: buckets must be an integer in 1..65536, got {buckets!r}")
    steps, names, kinds = [], set(), set()
    for i, entry in enumerate(doc["steps"]):
        at = f"{where}: steps[{i}]"
        if not isinstance(entry, dict) or len(entry) not in (1, 2) or (len(entry) == 2 and "name" not in entry):
            raise StepListError(f"{at}: each step is one mapping '<kind>: {{fields}}' (and optionally 'name: ...'); "
                                f"kinds: {', '.join(KINDS)}")
        kind = next(k for k in entry if k != "name")
        if kind not in KINDS:
            import difflib

            close = difflib.get_close_matches(str(kind), KINDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise StepListError(f"{at}: unknown step {kind!r}{hint}; kinds: {', '.join(KINDS)}")
        body = entry[kind] or {}
        if not isinstance(body, dict):
            raise StepListError(f"{at}.{kind}: expected a mapping of fields, got {body!r}")
        try:
            cfg = KINDS[kind](**body)
        except ValidationError as e:
            lines = "; ".join(f"{'.'.join(map(str, err['loc'])) or kind}: {err['msg']}" for err in e.errors())
            raise StepListError(f"{at}.{kind}: {lines}") from None
        name = str(entry.get("name", kind))
        if name in names:
            raise StepListError(f"{at}: step name {name!r} used twice; give one of them 'name: ...'")
        if kind in DEDUP_KINDS and kind in kinds:
            raise StepListError(f"{at}: {kind} appears twice; one of each dedup kind per run")
        names.add(name)
        kinds.add(kind)
        steps.append(Step(kind, name, cfg))
    spans = [i for i, st in enumerate(steps) if st.is_span_dedup]
    if len(spans) > 1:
        raise StepListError(f"{where}: steps[{spans[1]}]: one span dedup step (sentence_dedup or substring_dedup) per "
                            "run; run the other in a second curate over this one's output")
    if spans and any(st.is_dedup for st in steps[spans[0] + 1:]):
        raise StepListError(f"{where}: steps[{spans[0]}]: {steps[spans[0]].kind} must come after every other dedup "
                            "step (the hash pass cannot see the spans it will cut)")
    return StepList(steps, buckets)


def load_steps(path: str) -> StepList:
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except FileNotFoundError:
        raise StepListError(f"step list {path} not found (give a YAML file with a 'steps' list)") from None
    except yaml.YAMLError as e:
        raise StepListError(f"{path}: not valid YAML: {e}") from None
    return parse_steps(doc, where=path)


def step_list(spec: Union[str, dict, list, StepList, None]) -> Optional[StepList]:
    """A path, a parsed document or a StepList -> StepList (None stays None)."""
    if spec is None or isinstance(spec, StepList):
        return spec
    if isinstance(spec, str):
        return load_steps(spec)
    return parse_steps(spec)
