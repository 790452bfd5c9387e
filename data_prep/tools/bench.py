"""bench: (a) the bare tokenizer encoding whole documents vs (b) the full pipeline, same texts, same process count.

(a) reads the documents first (not timed), then each of N processes encodes its share whole with the library's own
call; throughput = all tokens / the slowest process's encode time. (b) is `python -m data_prep tokenize` as a
subprocess (read, tokenize, write shards, fsync, manifest), timed end to end including start-up; its peak RSS is the
largest peak resident set (VmHWM) of any of its processes (driver or worker). (c) is (b) with --no-fast-path. All for the corpus
and for one ``scale`` times larger (more distinct stdlib files, not repeats).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time

import orjson

from data_prep.tools.sample_corpus import build


def _bare_worker(args):
    corpus, tokenizer, k, n = args
    from data_prep.steps.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer)
    with open(corpus, "rb") as f:
        texts = [orjson.loads(line)["text"] for i, line in enumerate(f) if i % n == k]
    t0 = time.perf_counter()
    tokens = sum(len(ids) + 1 for ids in tok.encode_batch(texts))  # +1: the EOD the pipeline appends
    return time.perf_counter() - t0, tokens, sum(len(t.encode()) for t in texts)


def bare(corpus: str, tokenizer: str, workers: int) -> dict:
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        res = pool.map(_bare_worker, [(corpus, tokenizer, k, workers) for k in range(workers)])
    secs = max(r[0] for r in res)
    return {"seconds": secs, "tokens": sum(r[1] for r in res), "bytes": sum(r[2] for r in res)}


def pipeline(corpus: str, tokenizer: str, out: str, workers: int, fast: bool = True) -> dict:
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "data_prep", "tokenize", corpus, "-o", out, "-t", tokenizer, "-j", str(workers),
           "--shard-size", "1M", "-q"] + ([] if fast else ["--no-fast-path"])
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env)
    peak_mb = _peak_rss_of_tree_mb(p)
    secs = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"pipeline run failed: {' '.join(cmd)}")
    with open(os.path.join(out, "manifest.json"), "rb") as f:
        m = orjson.loads(f.read())
    return {"seconds": secs, "tokens": m["totals"]["tokens"], "bytes": os.path.getsize(corpus),
            "peak_rss_mb": peak_mb, "units": len(m["shards"]) + len(m["empty_units"])}


def _peak_rss_of_tree_mb(proc: subprocess.Popen, every_s: float = 0.01) -> float:
    """Largest peak resident set (VmHWM) of any process in proc's tree, read every ``every_s`` until it exits.

    Not wait4's ru_maxrss: a child started by fork/vfork + exec inherits the parent's high-water mark, so the
    bench's own memory (e.g. after training a tokenizer in-process) would be counted as the pipeline's."""
    import psutil

    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for q in tree:
            try:
                with open(f"/proc/{q.pid}/status") as f:
                    hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
                peak = max(peak, hwm * 1024)
            except (OSError, StopIteration):
                pass
        time.sleep(every_s)
    proc.wait()
    return peak / 2**20


def _row(name, r):
    mbs = r["bytes"] / r["seconds"] / 1e6
    tps = r["tokens"] / r["seconds"]
    rss = f"{r['peak_rss_mb']:8.0f}" if "peak_rss_mb" in r else "       -"
    return f"{name:34s} {r['seconds']:7.2f}s {tps:12,.0f} {mbs:8.2f} {rss}", tps


def _longest_document(corpus: str) -> int:
    with open(corpus, "rb") as f:
        return max(len(orjson.loads(line)["text"]) for line in f)


def bench(out_dir: str, corpus_mb: float = 3.0, workers: int = 2, scale: int = 10, tokenizer=None) -> int:
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    sizes = [("1x", int(corpus_mb * 1e6)), (f"{scale}x", int(corpus_mb * 1e6 * scale))]
    corpora = {name: build(os.path.join(out_dir, f"corpus_{name}"), size) for name, size in sizes}
    if tokenizer is None:
        from data_prep.steps.train_tokenizer import train

        prefix = os.path.join(out_dir, "tokenizer", "sp")
        tokenizer = prefix + ".model"
        if not os.path.exists(tokenizer):
            train([corpora["1x"]], prefix, vocab_size=4000, quiet=True, sample_bytes=int(corpus_mb * 1e6))
    tokenizer = os.path.abspath(tokenizer)
    print(f"bench: tokenizer {tokenizer}, {workers} process(es)")
    print(f"{'':34s} {'wall':>8s} {'tokens/s':>12s} {'MB/s':>8s} {'peakRSS':>8s}")
    rss = {}
    for name, _ in sizes:
        corpus = corpora[name]
        print(f"-- corpus {name}: {os.path.getsize(corpus) / 1e6:.1f} MB, longest document "
              f"{_longest_document(corpus):,} characters ({corpus})")
        a = bare(corpus, tokenizer, workers)
        b = pipeline(corpus, tokenizer, os.path.join(out_dir, f"shards_{name}"), workers)
        c = pipeline(corpus, tokenizer, os.path.join(out_dir, f"shards_{name}_nofast"), workers, fast=False)
        if not (a["tokens"] == b["tokens"] == c["tokens"]):
            print(f"token counts differ: bare {a['tokens']} pipeline {b['tokens']} no-fast {c['tokens']}")
            return 1
        line, ta = _row("(a) bare tokenizer, whole docs", a)
        print(line)
        line, tb = _row(f"(b) pipeline ({b['units']} units)", b)
        print(line)
        line, tc = _row("(c) pipeline --no-fast-path", c)
        print(line)
        print(f"   ratio b/a = {tb / ta:.2f}   c/a = {tc / ta:.2f}   tokens {b['tokens']:,} (identical counts)")
        rss[name] = b["peak_rss_mb"]
    names = [n for n, _ in sizes]
    grew = os.path.getsize(corpora[names[1]]) / os.path.getsize(corpora[names[0]])
    print(f"peak RSS {names[1]} / {names[0]} = {rss[names[1]] / rss[names[0]]:.2f} (goal <= 1.2) as the corpus grew "
          f"{grew:.1f}x")
    return 0
