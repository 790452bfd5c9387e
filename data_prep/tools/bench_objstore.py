"""Object storage vs local disk, side by side: the same corpus tokenized local -> local and s3 -> s3.

    python -m data_prep.tools.bench_objstore s3://bucket/bench --corpus-mb 8 -j 2 [--storage-option endpoint_url=...]

The bucket must exist; credentials and the endpoint come from the usual chain (AWS_* env, ~/.aws, AWS_ENDPOINT_URL_S3)
or --storage-option. Prints seconds, MB/s of input and the s3/local ratio for a fresh run and a resumed rerun (which
reads every completion marker back); checks the shards are byte-identical.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def _tokenize(args, env) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "data_prep", "tokenize", "-q", *args], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def bench(url: str, corpus_mb: float, workers: int, options: list) -> None:
    import fsspec

    from data_prep.tools.sample_corpus import build
    from data_prep.steps.train_tokenizer import train

    url = url.rstrip("/") + f"/run-{os.getpid()}"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    opts = [x for o in options for x in ("--storage-option", o)]
    with tempfile.TemporaryDirectory(prefix="bench_objstore-") as tmp:
        corpus = os.path.join(tmp, "corpus")
        build(corpus, int(corpus_mb * 1e6))
        tok = train([os.path.join(corpus, "stdlib.jsonl")], os.path.join(tmp, "sp"), vocab_size=3000, quiet=True,
                    sample_bytes=2_000_000)
        fs, root = fsspec.core.url_to_fs(url, **dict(o.split("=", 1) for o in options))
        fs.put(corpus + "/", root + "/corpus/", recursive=True)
        mb = sum(os.path.getsize(os.path.join(corpus, f)) for f in os.listdir(corpus)) / 1e6
        common = ["-t", tok, "-j", str(workers), "--shard-size", "1M", *opts]
        rows = []
        for label, src, out in (("local -> local", corpus, os.path.join(tmp, "out")),
                                ("s3 -> s3", url + "/corpus/", url + "/out")):
            first = _tokenize([src, "-o", out, *common], env)
            rerun = _tokenize([src, "-o", out, *common], env)
            rows.append((label, first, rerun))
        local_files = sorted(f for f in os.listdir(os.path.join(tmp, "out")) if f.endswith((".bin", ".idx")))
        same = all(fs.cat_file(f"{root}/out/{f}") == open(os.path.join(tmp, "out", f), "rb").read()
                   for f in local_files)
        fs.rm(root, recursive=True)
    print(f"corpus {mb:.1f} MB, {workers} worker(s), shards byte-identical: {same}")
    print(f"{'':16s} {'run s':>7s} {'MB/s':>6s} {'rerun s':>8s}")
    for label, first, rerun in rows:
        print(f"{label:16s} {first:7.2f} {mb / first:6.2f} {rerun:8.2f}")
    (_, lf, lr), (_, sf, sr) = rows
    print(f"{'s3 / local':16s} {sf / lf:6.2f}x {'':6s} {sr / lr:7.2f}x")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_prep.tools.bench_objstore", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", help="an s3:// (or other fsspec) prefix in an existing bucket; removed after")
    p.add_argument("--corpus-mb", type=float, default=8.0)
    p.add_argument("-j", "--workers", type=int, default=2)
    p.add_argument("--storage-option", action="append", default=[], metavar="NAME=VALUE")
    a = p.parse_args(argv)
    bench(a.url, a.corpus_mb, a.workers, a.storage_option)
    return 0


if __name__ == "__main__":
    sys.exit(main())
