"""The main job until training lands: sample corpus -> tokenizer -> shards -> verify -> summary."""

from __future__ import annotations

import os
import sys
import time


def demo(out_dir: str, workers: int = 2, quiet: bool = False, corpus_bytes: int = 4 << 20,
         vocab_size: int = 3000) -> int:
    from data_prep.tools.inspect_shards import summarize
    from data_prep.pipeline import Settings, run
    from data_prep.tools.sample_corpus import build
    from data_prep.steps.train_tokenizer import train
    from data_prep.write.verify import verify

    out_dir = os.path.abspath(out_dir)
    t0 = time.time()
    corpus = build(os.path.join(out_dir, "corpus"), corpus_bytes)
    print(f"[1/5] sample corpus: {corpus} ({os.path.getsize(corpus) / 1e6:.1f} MB, Python stdlib, PSF licence)")
    model = os.path.join(out_dir, "tokenizer", "sp")
    if not os.path.exists(model + ".model"):
        train([corpus], model, vocab_size=vocab_size, model_type="bpe", quiet=True)
    print(f"[2/5] tokenizer: {model}.model (sentencepiece BPE, vocab {vocab_size}, byte fallback)")
    shards = os.path.join(out_dir, "shards")
    m = run(Settings(inputs=[corpus], output_dir=shards, tokenizer=model + ".model", workers=workers,
                     shard_size=1 << 20, quiet=quiet))
    print(f"[3/5] tokenize: {m['totals']['shards']} shards, {m['totals']['tokens']:,} tokens -> {shards}")
    problems = verify(shards)
    for p in problems:
        print(f"FAIL {p}", file=sys.stderr)
    print(f"[4/5] verify: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    print("[5/5] summary:")
    print(summarize(shards, decode=1, chars=200))
    print(f"demo finished in {time.time() - t0:.1f}s; blend for megatron-core: {shards}/manifest.json")
    return 1 if problems else 0
