"""``decontaminate``: documents that share an n-gram (13 words by default, as GPT-3 and lm-eval's decontamination)
with an evaluation set are removed, the reason naming the set (``contaminated_<task or file>``).

Both sides are normalised the same way: lower-cased, every run of non-word characters a space, whitespace words.
An n-gram is one 64-bit hash (xxh3-64 of each word, combined by position as MinHash's shingles are; kernels.py):
a document is compared by a binary search of its n-gram hashes in the sorted evaluation hashes. Evaluation passages
shorter than n words add nothing (as in GPT-3's procedure).

``against`` takes files and lm-eval task names. A file: .jsonl/.json (every string in every record: question,
choices, answers) or .txt (the whole file). A task name is resolved offline from lm-eval's installed task YAMLs (read
as data: its dataset, config and evaluation splits; no task code is imported or run) and its data read from the local
Hugging Face datasets cache, never downloaded: a task whose data is not cached is refused before any work, with the
fix (cache it, or give a file).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from data_prep.steps.doc_steps import Doc, DocStep

_NON_WORD = re.compile(r"\W+")


class DecontaminateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ngram: int = Field(13, ge=3, le=64, description="words per n-gram")
    against: List[str] = Field(description="evaluation sets: files (.jsonl/.json/.txt) or lm-eval task names")

    @field_validator("against")
    @classmethod
    def _some(cls, v):
        if not v:
            raise ValueError("give at least one evaluation set (a file or an lm-eval task name)")
        return v


class NgramHasher:
    """64-bit hashes of a text's normalised word n-grams (compiled: kernels.word_hashes, shingle_hashes)."""

    def __init__(self, n: int):
        import xxhash

        from data_prep.steps import kernels

        self.n, self.k, self.xxh = n, kernels, xxhash.xxh3_64_intdigest
        self.weights = (np.random.RandomState(n).randint(0, 2**63, size=n, dtype=np.uint64) * np.uint64(2)
                        + np.uint64(1))

    def __call__(self, text: str) -> np.ndarray:
        k = self.k
        norm = _NON_WORD.sub(" ", text.lower())
        cps = k.code_points(norm)
        starts, ends = k.scan_words(cps, k.char_tables())[:2]
        if len(starts) < self.n:
            return np.zeros(0, np.uint64)
        wh, long_words = k.word_hashes(cps, starts, ends, k.XXH3_SECRET)
        if len(long_words):
            split = norm.split()
            for i in long_words.tolist():
                wh[i] = self.xxh(split[i].encode("utf-8", "surrogatepass"))
        return k.shingle_hashes(wh, self.weights, self.n)


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def file_passages(path: str) -> List[str]:
    if path.endswith(".txt"):
        with open(path, encoding="utf-8") as f:
            return [f.read()]
    out = []
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                out += list(_strings(orjson.loads(line)))
    return out


# --- lm-eval task names, resolved from its installed YAML files --------------------------------------------------


class _DataLoader(__import__("yaml").SafeLoader):
    """YAML as data: lm-eval's ``!function`` tags (code references) become None, never imported."""


_DataLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _tasks_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("decontaminate: lm-eval is not installed, so task names cannot be resolved; give files")
    return os.path.join(list(spec.submodule_search_locations)[0], "tasks")


def _read_yaml(path: str) -> dict:
    import yaml

    with open(path, encoding="utf-8") as f:
        doc = yaml.load(f, Loader=_DataLoader) or {}
    inc = doc.get("include")
    if isinstance(inc, str):  # lm-eval's template inheritance: the task's own keys win
        base = _read_yaml(os.path.join(os.path.dirname(path), inc))
        doc = {**base, **doc}
    return doc


@functools.lru_cache(maxsize=None)
def task_source(name: str) -> Tuple[str, Optional[str], Tuple[str, ...]]:
    """(dataset path, config name, evaluation splits) of an lm-eval task, from its YAML file."""
    pattern = re.compile(rb"^task:\s*['\"]?" + re.escape(name.encode()) + rb"['\"]?\s*$", re.M)
    for d, _, files in sorted(os.walk(_tasks_dir())):
        for fname in sorted(files):
            if not fname.endswith(".yaml"):
                continue
            path = os.path.join(d, fname)
            with open(path, "rb") as f:
                if not pattern.search(f.read()):
                    continue
            doc = _read_yaml(path)
            splits = tuple(s for s in (doc.get("test_split"), doc.get("validation_split")) if s)
            if doc.get("dataset_path") and splits:
                return doc["dataset_path"], doc.get("dataset_name"), splits
    raise ValueError(f"decontaminate: {name!r} is neither a file nor an lm-eval task with a dataset (its installed "
                     "task YAMLs name none); give a file of the evaluation texts")


def task_passages(name: str) -> List[str]:
    path, config, splits = task_source(name)
    import datasets

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the local cache only: nothing is downloaded at run time
    out = []
    for split in splits:
        try:
            ds = datasets.load_dataset(path, config, split=split)
        except Exception as e:
            where = path + (f" ({config})" if config else "")
            raise ValueError(f"decontaminate: task {name!r} reads {where}, split {split}, which is not in the local "
                             f"Hugging Face datasets cache ({type(e).__name__}); nothing is downloaded at run time: "
                             "cache it first (datasets.load_dataset on a machine with access, same HF_HOME), or give "
                             "a file of its texts") from None
        for row in ds:
            out += list(_strings(row))
    return out


def eval_ngrams(against: Tuple[str, ...], n: int) -> Tuple[np.ndarray, np.ndarray, Tuple[str, ...]]:
    """(sorted n-gram hashes, the index of the set each belongs to (the first that has it), set labels); built once
    per process and per version of the files (an edited file is read again)."""
    stamps = tuple((os.stat(a).st_size, os.stat(a).st_mtime_ns) if os.path.exists(a) else None for a in against)
    return _eval_ngrams(against, n, stamps)


@functools.lru_cache(maxsize=8)
def _eval_ngrams(against: Tuple[str, ...], n: int, stamps: tuple) -> Tuple[np.ndarray, np.ndarray, Tuple[str, ...]]:
    hasher, labels, parts = NgramHasher(n), [], []
    for i, src in enumerate(against):
        if os.path.exists(src):
            passages, label = file_passages(src), os.path.splitext(os.path.basename(src))[0]
        else:
            passages, label = task_passages(src), src
        labels.append(label)
        hashes = [hasher(p) for p in passages]
        h = np.unique(np.concatenate(hashes)) if hashes else np.zeros(0, np.uint64)
        parts.append((h, np.full(len(h), i, np.int32)))
    allh = np.concatenate([p[0] for p in parts])
    owner = np.concatenate([p[1] for p in parts])
    order = np.lexsort((owner, allh))  # by hash, then the first set
    allh, owner = allh[order], owner[order]
    first = np.concatenate(([True], allh[1:] != allh[:-1])) if len(allh) else np.zeros(0, bool)
    return allh[first], owner[first], tuple(labels)


class Decontaminate(DocStep):
    def __init__(self, cfg: DecontaminateConfig):
        super().__init__(cfg)
        self.hashes, self.owner, self.labels = eval_ngrams(tuple(cfg.against), cfg.ngram)
        self.hasher = NgramHasher(cfg.ngram)

    def apply(self, doc: Doc) -> Optional[str]:
        if not len(self.hashes):
            return None
        grams = self.hasher(doc.text)
        if not len(grams):
            return None
        at = np.searchsorted(self.hashes, grams)
        at[at == len(self.hashes)] = 0
        hit = np.flatnonzero(self.hashes[at] == grams)
        if not len(hit):
            return None
        return f"contaminated_{self.labels[int(self.owner[at[hit]].min())]}"


def check(cfg: DecontaminateConfig) -> Dict[str, int]:
    """Load every evaluation set now (the driver, before any work): a missing file or uncached task fails here."""
    h, owner, labels = eval_ngrams(tuple(cfg.against), cfg.ngram)
    return {label: int((owner == i).sum()) for i, label in enumerate(labels)}
