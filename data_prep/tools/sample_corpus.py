"""An embedded sample corpus: real text from the running Python's standard library (PSF licence), no download.

Each record is one module's source (code with its comments and docstrings, a mix of prose and code) with its relative
path and licence. Files are taken in sorted path order until ``max_bytes``, so the corpus is reproducible for a given
Python version. site-packages is excluded (third-party licences).
"""

from __future__ import annotations

import os
import sysconfig

import orjson

from data_prep import io

LICENSE = "PSF-2.0"


def _stdlib_files():
    root = sysconfig.get_paths()["stdlib"]
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "dist-packages", "__pycache__", "idle_test")
                         and not x.startswith("."))
        for name in sorted(files):
            if name.endswith(".py"):
                yield root, os.path.join(d, name)


def build(out_dir: str, max_bytes: int = 4 << 20, name: str = "stdlib.jsonl") -> str:
    """Write ``out_dir/name`` (.jsonl, field ``text``) of at most about ``max_bytes``; returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    written = 0
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for root, file in _stdlib_files():
            try:
                with open(file, encoding="utf-8") as src:
                    text = src.read()
            except (UnicodeDecodeError, OSError):
                continue
            if not text.strip() or "\x00" in text:
                continue
            line = orjson.dumps({"text": text, "source": os.path.relpath(file, root), "license": LICENSE}) + b"\n"
            if written + len(line) > max_bytes:
                if max_bytes - written < max_bytes // 20:
                    break
                continue  # too big for what is left: a smaller file may still fit
            f.write(line)
            written += len(line)
    io.replace_unless_identical(tmp, path)
    return path
