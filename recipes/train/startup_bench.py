"""Start-up over many shards: ``python -m recipes.train.startup_bench OUT --shards 10000 [--per-prefix]``.

Writes N tiny shards and their manifest (once, kept in OUT; past the first 1,000, hard links to those), then times ``build_datasets`` for the tiny CPU recipe in
one process: cold (empty index cache) and warm (the cache built). ``--per-prefix`` also times megatron-core's own
way, one GPTDataset per shard (what training did before shard_set.py; give a small N: it takes minutes at 10,000).
Prints wall and CPU seconds, the peak RSS and the load average beside them.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def write_shards(root: Path, shards: int, docs: int = 4, seed: int = 0, distinct: int = 1000) -> Path:
    """``distinct`` shards written, the rest hard links to them (a start-up bench reads every .idx all the same)."""
    from data_prep.write.shards import ShardWriter

    if (root / "manifest.json").is_file():
        return root
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(shards):
        name = f"shard_{i:06d}"
        if i >= distinct:
            for suffix in (".bin", ".idx"):
                os.link(root / (entries[i % distinct]["prefix"] + suffix), root / (name + suffix))
            entries.append({**entries[i % distinct], "prefix": name})
            continue
        w = ShardWriter(str(root / name), np.uint16, fsync=False)
        for _ in range(docs):
            w.add_document([np.append(rng.integers(1, 300, int(rng.integers(20, 200))), 0).astype(np.uint16)])
        entries.append({"prefix": name, **w.finalize()})
    manifest = {"tokenizer": {"type": "bench", "path": "", "vocab_size": 300, "eod_id": 0, "pad_id": None},
                "dtype": "uint16", "shards": entries}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def _timed(fn) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "out": out}


def _import_dataset_modules() -> None:
    from data_prep.lazy_compile import import_with_compile_deferred

    import_with_compile_deferred(("megatron.core",))  # as a rank imports it (recipes.train.cli)
    for name in ("blended_megatron_dataset_builder", "gpt_dataset", "blended_dataset"):
        importlib.import_module(f"megatron.core.datasets.{name}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--shards", type=int, default=10_000)
    p.add_argument("--per-prefix", action="store_true", help="also time one megatron-core GPTDataset per shard")
    a = p.parse_args(argv)
    import torch.distributed as dist

    from recipes.config.loading import load_recipe
    from recipes.train.data import build_datasets

    root = Path(a.out) / f"shards_{a.shards}"
    t = _timed(lambda: write_shards(root, a.shards))
    print(f"{a.shards:,} shards in {root} (written in {t['wall_s']:.1f} s)")
    t = _timed(_import_dataset_modules)  # a rank has them imported before it builds its datasets: timed on their own
    print(f"  {'imports (megatron-core and its datasets), once per process':55s} wall {t['wall_s']:7.2f} s  "
          f"cpu {t['cpu_s']:7.2f} s")
    store = tempfile.mkdtemp()
    dist.init_process_group("gloo", init_method=f"file://{store}/pg", rank=0, world_size=1)
    repo = Path(__file__).resolve().parents[2]
    recipe = load_recipe(repo / "configs" / "runs" / "tiny-cpu.yaml", [f"data.manifests=[{root}]"])
    cache = Path(a.out) / f"cache_{a.shards}"
    shutil.rmtree(cache, ignore_errors=True)
    runs = [("one dataset over all shards, cold cache", []), ("one dataset over all shards, warm cache", [])]
    if a.per_prefix:  # data.blend keeps one GPTDataset per prefix: megatron-core's own way
        m = json.loads((root / "manifest.json").read_text())
        blend = "[" + ",".join(f"[{s['tokens']},{root / s['prefix']}]" for s in m["shards"]) + "]"
        runs.append(("one GPTDataset per shard (megatron-core), cold cache", [f"data.blend={blend}"]))
    for name, extra in runs:
        r = load_recipe(repo / "configs" / "runs" / "tiny-cpu.yaml", [f"data.manifests=[{root}]", *extra]) \
            if extra else recipe
        res = _timed(lambda: build_datasets(r, 10_000, 1_000, str(cache)))
        train, _ = res["out"]
        print(f"  {name:55s} wall {res['wall_s']:7.2f} s  cpu {res['cpu_s']:7.2f} s  train samples {len(train):,}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  peak RSS of this process {rss:.0f} MB; load average {' '.join(os.getloadavg().__repr__()[1:-1].split(', '))}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
