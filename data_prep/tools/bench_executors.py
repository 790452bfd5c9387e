"""bench-executors: the same tokenize run on the local process pool, the hostfile executor over ssh, and Ray.

Same corpus (the embedded stdlib sample), same tokenizer (sentencepiece BPE trained on it, as `bench`), same settings,
same total worker count W: (1) `tokenize -j W`; (2) `launch/prep.sh` over the nodes of ``--hostfile`` (default
$LAUNCH_HOSTFILE; ssh options from $LAUNCH_SSH_CONFIG, as for prep.sh itself), skipped without one; (3)
`tokenize --executor ray -j W` on a local Ray instance it starts. Each is a subprocess timed end to end, start-up
included, and is also run on a one-document corpus to show that fixed cost alone. The outputs must be byte-identical
to (1) (non-zero exit if not).

On one machine, two loopback "nodes" behind a private sshd (the tests' helper) stand in for a cluster:
``python tests/support/loopback_ssh.py --slots 1 -- python -m data_prep bench-executors /tmp/be -j 2``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import List, Optional

import orjson

from data_prep.tools.sample_corpus import build

# launch/prep.sh of the checkout this package runs from (an editable install); absent in a plain `pip install .`
PREP_SH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "launch",
                       "prep.sh")
# One thread per worker: W workers = W cores, so per-core figures are comparable across executors.
ENV = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1")
ENV.pop("LAUNCH_SSH_SHIM", None)  # a parent launch script's ssh wrapper would point at another ssh config


def _tree(d: str) -> dict:
    """Every output file's bytes; failed_units.json is a per-run report (absent or empty), not output."""
    out = {}
    for root, _, files in os.walk(d):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), d)
            if rel != "failed_units.json":
                with open(os.path.join(root, name), "rb") as f:
                    out[rel] = f.read()
    return out


def _run(cmd: list, out: str, env: dict) -> dict:
    shutil.rmtree(out, ignore_errors=True)  # a leftover output would be resumed (skipped), not redone
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    with open(os.path.join(out, "manifest.json"), "rb") as f:
        m = orjson.loads(f.read())
    return {"seconds": secs, "units": len(m["shards"]) + len(m["empty_units"]), "tree": _tree(out)}


def _hosts(hostfile: str) -> List[tuple]:
    """(host, slots) of a DeepSpeed-style hostfile, for the table's label."""
    out = []
    with open(hostfile) as f:
        for line in f:
            words = line.split("#", 1)[0].split()
            if words:
                slots = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("slots=")), "1")
                out.append((words[0], slots))
    return out


def bench_executors(out_dir: str, corpus_mb: float = 4.0, workers: int = 2, shard_size: int = 256_000,
                    tokenizer=None, hostfile: Optional[str] = None) -> int:
    out_dir = os.path.abspath(out_dir)
    corpus = build(os.path.join(out_dir, "corpus"), int(corpus_mb * 1e6))
    # The fixed cost alone: the same run on a corpus of one document (the corpus's first line).
    one = os.path.join(out_dir, "corpus_one", "one.jsonl")
    os.makedirs(os.path.dirname(one), exist_ok=True)
    with open(corpus, "rb") as src, open(one, "wb") as dst:
        dst.write(src.readline())
    if tokenizer is None:
        from data_prep.steps.train_tokenizer import train

        prefix = os.path.join(out_dir, f"tokenizer_{corpus_mb:g}MB", "sp")  # trained on this corpus
        tokenizer = prefix + ".model"
        if not os.path.exists(tokenizer):
            train([corpus], prefix, vocab_size=4000, quiet=True, sample_bytes=int(corpus_mb * 1e6))
    tokenizer = os.path.abspath(tokenizer)
    mb = os.path.getsize(corpus) / 1e6

    def args(inp, out):
        return [inp, "-o", out, "-t", tokenizer, "--shard-size", str(shard_size), "-q"]

    py = [sys.executable, "-m", "data_prep", "tokenize"]
    cases = [(f"local pool -j {workers}", lambda inp, out: py + args(inp, out) + ["-j", str(workers)], ENV)]
    ref, bad = None, 0
    hostfile = hostfile or os.environ.get("LAUNCH_HOSTFILE")
    if not hostfile:
        print("hostfile case skipped: pass --hostfile FILE (lines 'host slots=N'), or run under "
              "tests/support/loopback_ssh.py for two loopback nodes")
    elif not os.path.exists(PREP_SH):
        print(f"hostfile case skipped: {PREP_SH} not found (run from a checkout: pip install -e .)")
    else:
        hosts = _hosts(hostfile)
        # prep.sh: node i runs slice i/H with its slots as workers over ssh, then merges the manifest here. Its logs
        # go next to the output, not into it, so the trees compare equal.
        prep = ["bash", PREP_SH, "--hostfile", os.path.abspath(hostfile), "--log-dir"]
        cases.append((f"hostfile ssh {'+'.join(s for _, s in hosts)}",
                      lambda inp, out: prep + [out + ".logs", "--", *args(inp, out)],
                      dict(ENV, LAUNCH_SSH_TIMEOUT=ENV.get("LAUNCH_SSH_TIMEOUT", "20"))))
    # No --ray-address: the run starts (and stops) its own local Ray instance with W CPUs.
    cases.append((f"ray local -j {workers}",
                  lambda inp, out: py + args(inp, out) + ["--executor", "ray", "-j", str(workers)], ENV))

    print(f"bench-executors: {mb:.1f} MB corpus ({corpus}), tokenizer {tokenizer}, shard size {shard_size:,} "
          f"bytes, {workers} workers in all (one per core), wall time end to end incl. start-up")
    print(f"{'executor':22s} {'wall s':>7s} {'1-doc s':>7s} {'units':>5s} {'units/s':>7s} {'MB/s':>6s} "
          f"{'MB/s/core':>9s}  identical to local")
    for name, cmd, env in cases:
        tag = name.split()[0]
        fixed = _run(cmd(one, os.path.join(out_dir, f"one_{tag}")), os.path.join(out_dir, f"one_{tag}"), env)
        out = os.path.join(out_dir, f"shards_{tag}")
        r = _run(cmd(corpus, out), out, env)
        if ref is None:
            ref, same = r["tree"], "(reference)"
        else:
            diff = sorted(k for k in set(ref) | set(r["tree"]) if ref.get(k) != r["tree"].get(k))
            same = "yes" if not diff else f"NO: {len(diff)} files differ, e.g. {diff[:3]}"
            bad += bool(diff)
        s = r["seconds"]
        print(f"{name:22s} {s:7.2f} {fixed['seconds']:7.2f} {r['units']:5d} {r['units'] / s:7.2f} "
              f"{mb / s:6.2f} {mb / s / workers:9.2f}  {same}", flush=True)
    print(f"{len(ref)} output files per run (shards .bin/.idx, stats, rejects, manifest); 1-doc s = the same command "
          "on a one-document corpus: start-up, tokenizer load, ssh / Ray, manifest")
    if bad:
        print("FAIL: outputs differ between executors", file=sys.stderr)
        return 1
    return 0
