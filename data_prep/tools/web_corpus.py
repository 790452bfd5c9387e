"""A varied bench corpus from what is installed: documentation and source cut into web-page-sized documents.

Whole stdlib modules (sample_corpus.py) are long and all Python; tokenizer benches on them flatter a piece cache.
This mixes four streams, one document from each in turn: Python stdlib sources, the Python environment's
documentation and data files (.md/.rst/.txt/.yaml/.json, several of them multilingual: lm-eval task data), the system's
/usr/share/doc files (READMEs, change logs, copyright files; .gz read through) and its manual pages (troff source).
Each file is cut at line ends into documents of 1-16 KB (log-uniform, seeded), the size of a web page's text.
Deterministic for a given machine and ``max_bytes``; nothing is downloaded; the corpus is for local benches only.
"""

from __future__ import annotations

import gzip
import math
import os
import random
import site
import sysconfig
from typing import Iterator, List

import orjson

from data_prep import io

_DOC_SUFFIXES = (".md", ".rst", ".txt", ".yaml", ".yml", ".json", ".html", ".csv")


def _walk(root: str, keep) -> Iterator[str]:
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x != "__pycache__")
        for name in sorted(files):
            if keep(name):
                yield os.path.join(d, name)


def _streams() -> List[Iterator[str]]:
    stdlib = sysconfig.get_paths()["stdlib"]
    pkgs = [p for p in site.getsitepackages() if os.path.isdir(p)]
    return [
        _walk(stdlib, lambda n: n.endswith(".py")),
        (f for p in pkgs for f in _walk(p, lambda n: n.endswith(_DOC_SUFFIXES))),
        _walk("/usr/share/doc", lambda n: not n.endswith((".png", ".jpg", ".svg", ".ico", ".pdf"))),
        _walk("/usr/share/man", lambda n: n.endswith(".gz")),
    ]


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(4 << 20)
        if path.endswith(".gz"):
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return ""
    return "" if "\x00" in text else text


def _pages(text: str, rng: random.Random) -> Iterator[str]:
    """The text cut at line ends into pieces of 1-16 KB (log-uniform)."""
    lines = text.splitlines(keepends=True)
    page, size, want = [], 0, 0
    for line in lines:
        if not page:
            want = int(math.exp(rng.uniform(math.log(1024), math.log(16384))))
        page.append(line)
        size += len(line)
        if size >= want:
            yield "".join(page)
            page, size = [], 0
    if page:
        yield "".join(page)


def build_web(out_dir: str, max_bytes: int = 32 << 20, name: str = "web.jsonl", seed: int = 0) -> str:
    """Write ``out_dir/name`` (.jsonl, fields ``text`` and ``source``) of about ``max_bytes``; returns its path.
    Stops early (smaller) when every stream is exhausted."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    rng = random.Random(seed)
    streams = _streams()
    pending: List[List[bytes]] = [[] for _ in streams]
    written, tmp = 0, path + ".tmp"
    with open(tmp, "wb") as f:
        while written < max_bytes and streams:
            for k in range(len(streams) - 1, -1, -1):
                while not pending[k]:
                    file = next(streams[k], None)
                    if file is None:
                        break
                    text = _read(file)
                    if text.strip():
                        src = os.path.basename(file)
                        pending[k] = [orjson.dumps({"text": p, "source": src}) + b"\n"
                                      for p in _pages(text, rng) if p.strip()][::-1]
                if not pending[k]:
                    del streams[k], pending[k]
                    continue
                line = pending[k].pop()
                f.write(line)
                written += len(line)
    io.replace_unless_identical(tmp, path)
    return path
