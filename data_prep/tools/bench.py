"""bench: per tokenizer family, our pipeline vs bare gigatoken vs the bare library vs Megatron-LM, one run.

The corpus is varied real text (web_corpus.py: documentation and source cut into web-page-sized documents); one
tokenizer per family is trained on it (``--vocab-size``, default 32k): sentencepiece BPE with nmt_nfkc, nfkc_cf and
identity (Llama-2 style) normalization, and a Hugging Face byte-level BPE tokenizer.json (GPT-2 style). Per family,
the same corpus, tokenizer and number of processes:
- bare gigatoken: gigatoken's own file API (``encode_files`` over the jsonl: reading and JSON in Rust, ids out, no
  shard written) as a subprocess on N threads, end to end (start-up, load, encode); families gigatoken supports only;
- bare: N processes each encode their share of the documents whole with the library's own call (reading untimed);
  seconds = the slowest process's encode time;
- ours: `python -m data_prep tokenize` as a subprocess, end to end (start-up, read, tokenize, write, fsync, manifest);
- Megatron: (with ``--megatron-lm PATH``, a Megatron-LM checkout) its tools/preprocess_data.py as a subprocess with
  --workers N --append-eod, end to end, same tokenizer (the HF one as a directory with tokenizer_config.json); and,
  when the checkout has it (``--megatron-lm-fast``, Megatron-LM main), tools/preprocess_data_fast.py (gigatoken
  inside, --use-gigatoken, one process on N threads) the same way, a sentencepiece model given to it as the HF
  tokenizer.json gigatoken converts it to (its file API takes HF tokenizers only), and on the bigger corpus too
  (it holds every document's ids in memory before writing). With triton installed it runs with its real imports.
Wall seconds and CPU seconds (all processes; steadier than wall on a shared machine) are both printed; ratios are
speed-ups (their seconds / ours). Peak RSS = the largest VmHWM of any process of a run; ours is also run on a
corpus ``scale`` times larger (more distinct text, not repeats) to show it stays flat.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional

import orjson

from data_prep.tools.web_corpus import build_web

FAMILIES = {  # name -> how its tokenizer is made
    "sp-bpe nmt_nfkc": ("sp", "nmt_nfkc"),
    "sp-bpe nfkc_cf": ("sp", "nfkc_cf"),
    "sp-bpe identity (Llama-2 style)": ("sp", "identity"),
    "hf byte-level BPE (GPT-2 style)": ("hf", None),
}
_ENV = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1")


def _bare_worker(args):
    corpus, tokenizer, k, n = args
    from data_prep.steps.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer)
    with open(corpus, "rb") as f:
        texts = [orjson.loads(line)["text"] for i, line in enumerate(f) if i % n == k]
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = sum(len(ids) + 1 for ids in tok.encode_batch(texts))  # +1: the EOD the pipeline appends
    return time.perf_counter() - t0, time.process_time() - c0, tokens


def bare(corpus: str, tokenizer: str, workers: int) -> dict:
    with mp.get_context("spawn").Pool(workers) as pool:
        res = pool.map(_bare_worker, [(corpus, tokenizer, k, workers) for k in range(workers)])
    return {"seconds": max(r[0] for r in res), "cpu": sum(r[1] for r in res), "tokens": sum(r[2] for r in res)}


_GIGATOKEN = """
import sys, gigatoken as gt
corpus, tok = sys.argv[1], sys.argv[2]
g = gt.Tokenizer.from_sentencepiece(tok) if tok.endswith(".model") else gt.Tokenizer(tok)
ids = g.encode_files(gt.JsonlFileSource([corpus], field="text"), parallel=True)
import awkward as ak
print(int(ak.sum(ak.num(ids, axis=1))) + len(ids))
"""


def bare_gigatoken(corpus: str, tokenizer: str, workers: int) -> dict:
    """gigatoken's encode_files on ``workers`` threads, as a subprocess (tokens + 1 EOD per document)."""
    env = dict(_ENV, RAYON_NUM_THREADS=str(workers))
    r = _timed([sys.executable, "-c", _GIGATOKEN, corpus, tokenizer], env=env, stdout=True)
    r["tokens"] = int(r.pop("stdout").split()[-1])
    return r


def _timed(cmd: List[str], cwd: Optional[str] = None, env: Optional[dict] = None, stdout: bool = False) -> dict:
    """Run ``cmd``: wall and CPU seconds (it and every process it waited for), peak RSS of its process tree."""
    import tempfile

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = tempfile.TemporaryFile() if stdout else subprocess.DEVNULL
    p = subprocess.Popen(cmd, cwd=cwd, env=env or _ENV, stdout=out, stderr=subprocess.PIPE)
    peak_mb = _peak_rss_of_tree_mb(p)
    secs = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr.read().decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    res = {"seconds": secs, "cpu": cpu, "peak_rss_mb": peak_mb}
    if stdout:
        out.seek(0)
        res["stdout"] = out.read().decode()
    return res


def pipeline(corpus: str, tokenizer: str, out: str, workers: int, fast: bool = True) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    r = _timed([sys.executable, "-m", "data_prep", "tokenize", corpus, "-o", out, "-t", tokenizer, "-j", str(workers),
                "--shard-size", "16M", "-q"] + ([] if fast else ["--no-fast-path"]))
    with open(os.path.join(out, "manifest.json"), "rb") as f:
        r["tokens"] = orjson.loads(f.read())["totals"]["tokens"]
    return r


def megatron(megatron_lm: str, corpus: str, tokenizer: str, out: str, workers: int, fast: bool = False) -> dict:
    """Megatron-LM's tools/preprocess_data.py (or, ``fast``, preprocess_data_fast.py: gigatoken on ``workers``
    threads), run through megatron_lm_runner (see there why)."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    kind = "SentencePieceTokenizer" if tokenizer.endswith(".model") else "HuggingFaceTokenizer"
    env = dict(_ENV, PYTHONPATH=os.path.abspath(megatron_lm), RAYON_NUM_THREADS=str(workers))
    script = "preprocess_data_fast.py" if fast else "preprocess_data.py"
    extra = ["--use-gigatoken"] if fast else ["--workers", str(workers), "--log-interval", "100000"]
    r = _timed([sys.executable, "-m", "data_prep.tools.megatron_lm_runner",
                os.path.join(megatron_lm, "tools", script), "--input", corpus, "--output-prefix",
                os.path.join(out, "mlm"), "--tokenizer-type", kind, "--tokenizer-model", tokenizer,
                "--append-eod"] + extra, cwd=out, env=env)
    from data_prep.write.shards import indexed_dataset_class

    ds = indexed_dataset_class()(os.path.join(out, "mlm_text_document"))
    r["tokens"] = int(ds.sequence_lengths.sum())
    return r


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


def make_tokenizer(family: str, corpus: str, out_dir: str, vocab_size: int, sample_bytes: int) -> str:
    """Train the family's tokenizer on the corpus (kept in out_dir for reruns); returns its path."""
    kind, norm = FAMILIES[family]
    if kind == "sp":
        from data_prep.steps.train_tokenizer import train

        prefix = os.path.join(out_dir, "tokenizers", f"sp_{norm}_{vocab_size}")
        if not os.path.exists(prefix + ".model"):
            train([corpus], prefix, vocab_size=vocab_size, quiet=True, sample_bytes=sample_bytes, normalization=norm)
        return prefix + ".model"
    # A directory (tokenizer.json + tokenizer_config.json naming the EOD), which both we and Megatron-LM load.
    d = os.path.join(out_dir, "tokenizers", f"hf_bytelevel_{vocab_size}")
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

        def texts():
            seen = 0
            with open(corpus, "rb") as f:
                for line in f:
                    t = orjson.loads(line)["text"]
                    yield t
                    seen += len(t)
                    if seen >= sample_bytes:
                        return

        tok.train_from_iterator(texts(), trainer)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "wb") as f:
            f.write(orjson.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                                  "bos_token": None}))
    return d


def _gigatoken_builds(tokenizer: str) -> bool:
    from data_prep.steps.gigatoken_bpe import GigatokenBPE
    from data_prep.steps.tokenizers import load_tokenizer

    return GigatokenBPE.build(load_tokenizer(tokenizer))[0] is not None


def _method(tokenizer: str) -> str:
    from data_prep.steps.fast_path import FastEncoder
    from data_prep.steps.tokenizers import load_tokenizer

    return FastEncoder(load_tokenizer(tokenizer)).method


def _refuse_bad_options(families: List[str], megatron_lm: Optional[str], megatron_lm_fast: Optional[str]) -> str:
    """One line saying what is wrong with the options (and what to give instead), or ''."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        return f"bench: unknown family {unknown}; choose from {list(FAMILIES)}"
    if megatron_lm and not os.path.exists(os.path.join(megatron_lm, "tools", "preprocess_data.py")):
        return f"bench: --megatron-lm {megatron_lm}: no tools/preprocess_data.py there (give a Megatron-LM checkout)"
    if megatron_lm_fast and not os.path.exists(os.path.join(megatron_lm_fast, "tools", "preprocess_data_fast.py")):
        return (f"bench: --megatron-lm-fast {megatron_lm_fast}: no tools/preprocess_data_fast.py there (give a "
                "Megatron-LM checkout of main, e.g. git archive of NVIDIA/Megatron-LM main)")
    return ""


def bench(out_dir: str, corpus_mb: float = 32.0, workers: int = 2, scale: int = 10, vocab_size: int = 32000,
          megatron_lm: Optional[str] = None, families: Optional[List[str]] = None,
          megatron_lm_fast: Optional[str] = None) -> int:
    out_dir = os.path.abspath(out_dir)
    families = families or list(FAMILIES)
    bad = _refuse_bad_options(families, megatron_lm, megatron_lm_fast)
    if bad:
        print(bad, file=sys.stderr)
        return 2
    os.makedirs(out_dir, exist_ok=True)
    fast_lm = megatron_lm_fast or megatron_lm
    if fast_lm and not os.path.exists(os.path.join(fast_lm, "tools", "preprocess_data_fast.py")):
        fast_lm = None  # an older checkout given as --megatron-lm only
    small = build_web(os.path.join(out_dir, "corpus_1x"), int(corpus_mb * 1e6))
    big = build_web(os.path.join(out_dir, f"corpus_{scale}x"), int(corpus_mb * 1e6 * scale)) if scale > 1 else None
    mb = os.path.getsize(small) / 1e6
    print(f"bench: {workers} process(es); corpus {mb:.1f} MB of web-page-sized documents ({small})"
          + (f", and {os.path.getsize(big) / 1e6:.1f} MB for the peak-RSS check" if big else ""))
    if megatron_lm or fast_lm:
        print(f"bench: {triton_note()}")
    print(f"{'':44s} {'wall s':>7s} {'cpu s':>7s} {'MB/s':>6s} {'peakRSS':>7s}  tokens")
    rows: List[Dict] = []
    for family in families:
        row = _bench_family(family, small, big and (big, scale), out_dir, workers, vocab_size, megatron_lm, fast_lm)
        if row is None:
            return 1
        rows.append(row)
    _summary(rows, scale if big else None)
    return 0


def _bench_family(family: str, small: str, big: Optional[tuple], out_dir: str, workers: int, vocab_size: int,
                  megatron_lm: Optional[str], fast_lm: Optional[str]) -> Optional[Dict]:
    """Every run of one family, printed; the summary row, or None when a token count differs from the library's.
    ``big``: (corpus, scale) for the peak-RSS runs, or None."""
    mb = os.path.getsize(small) / 1e6
    tok_dir = make_tokenizer(family, small, out_dir, vocab_size, sample_bytes=min(int(mb * 1e6), 20_000_000))
    # The HF tokenizer: its tokenizer.json for us and the bare library (loading the directory would import
    # transformers, ~2 s and ~200 MB of start-up); the directory for Megatron-LM, which needs one.
    tok = os.path.join(tok_dir, "tokenizer.json") if os.path.isdir(tok_dir) else tok_dir
    method = _method(tok)
    print(f"-- {family}: ours encodes with {method} ({tok})")
    runs = {"ours": pipeline(small, tok, os.path.join(out_dir, "shards"), workers)}
    if _gigatoken_builds(tok):
        runs["gigatoken"] = bare_gigatoken(small, tok, workers)
    runs["bare"] = bare(small, tok, workers)
    if megatron_lm:
        runs["Megatron"] = megatron(megatron_lm, small, tok_dir, os.path.join(out_dir, "megatron"), workers)
    if fast_lm:
        runs.update(_megatron_fast(fast_lm, small, tok_dir, os.path.join(out_dir, "mlm_fast"), workers))
    for name, r in runs.items():
        rss = f"{r['peak_rss_mb']:7.0f}" if "peak_rss_mb" in r else "      -"
        print(f"   {name:41s} {r['seconds']:7.2f} {r['cpu']:7.2f} {mb / r['seconds']:6.2f} {rss}  {r['tokens']:,}")
    differ = [n for n, r in runs.items() if r["tokens"] != runs["bare"]["tokens"]]
    for n in [n for n in differ if n in ("gigatoken", "Megatron fast")]:  # not ours: a finding, not a failure
        print(f"   note: {n} gives {runs[n]['tokens']:,} tokens, the library {runs['bare']['tokens']:,}: "
              "not the library's ids for this family")
        differ.remove(n)
    if differ:
        print(f"token counts differ from the bare library's ({runs['bare']['tokens']:,}): "
              + ", ".join(f"{n} {runs[n]['tokens']:,}" for n in differ))
        return None
    row = {"family": family, "method": method, **runs}
    if big:
        corpus, scale = big
        row["big"] = pipeline(corpus, tok, os.path.join(out_dir, "shards_big"), workers)
        _print_big(f"ours, {scale}x corpus", row["big"], corpus)
        if "Megatron fast" in runs:  # it holds the whole corpus's ids before writing: show how its peak grows
            row["Megatron fast big"] = megatron(fast_lm, corpus, hf_dir_for_megatron_fast(tok_dir),
                                                os.path.join(out_dir, "mlm_fast"), workers, fast=True)
            _print_big(f"Megatron fast, {scale}x corpus", row["Megatron fast big"], corpus)
            if row["Megatron fast big"]["tokens"] != row["big"]["tokens"]:  # ours: the library's ids (self-check)
                print(f"   note: Megatron fast gives {row['Megatron fast big']['tokens']:,} tokens on the {scale}x "
                      f"corpus, ours {row['big']['tokens']:,}")
    return row


def _print_big(name: str, r: dict, corpus: str) -> None:
    print(f"   {name:41s} {r['seconds']:7.2f} {r['cpu']:7.2f} {os.path.getsize(corpus) / 1e6 / r['seconds']:6.2f} "
          f"{r['peak_rss_mb']:7.0f}  {r['tokens']:,}")


def hf_dir_for_megatron_fast(tokenizer: str) -> str:
    """The tokenizer as preprocess_data_fast.py can take it: its ``tokenize_files`` is implemented for HuggingFace
    tokenizers only (a SentencePieceTokenizer raises NotImplementedError), so a sentencepiece .model is given as an
    HF directory whose tokenizer.json is gigatoken's own conversion of the model (normalizer, byte fallback and
    dummy prefix honoured; what a Megatron-LM user would load), made once, outside the timing. Any other
    tokenizer (an HF directory) is returned as is."""
    if not tokenizer.endswith(".model"):
        return tokenizer
    d = tokenizer[: -len(".model")] + "_hf"
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        import sentencepiece as spm
        from gigatoken._load.sentencepiece import sentencepiece_to_tokenizer_json

        with open(tokenizer, "rb") as f:
            data = sentencepiece_to_tokenizer_json(f.read())
        sp = spm.SentencePieceProcessor(model_file=tokenizer)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer_config.json"), "wb") as f:  # the EOD Megatron appends: the model's eos
            f.write(orjson.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                                  "eos_token": sp.id_to_piece(sp.eos_id())}))
        with open(os.path.join(d, "tokenizer.json"), "w") as f:  # last: its presence marks a finished conversion
            f.write(data)
    return d


def _megatron_fast(megatron_lm: str, corpus: str, tokenizer: str, out: str, workers: int) -> Dict[str, dict]:
    try:
        hf_dir = hf_dir_for_megatron_fast(tokenizer)
        return {"Megatron fast": megatron(megatron_lm, corpus, hf_dir, out, workers, fast=True)}
    except Exception as e:  # a peer's tool (a missing dependency, a model gigatoken cannot convert): go on without
        print(f"   Megatron fast: did not run ({str(e).strip().splitlines()[-1][:160]})")
        return {}


def triton_note() -> str:
    """How Megatron-LM's kernel module is imported here (see megatron_lm_runner)."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return "triton not installed: Megatron-LM's batch-invariant kernel module is stubbed (no triton import)"
    return f"triton {importlib.metadata.version('triton')} installed: Megatron-LM runs with its real imports"


def _summary(rows: List[Dict], scale: Optional[int]) -> None:
    """One line per family: seconds of each, then ours vs each as speed-ups (theirs / ours; wall; cpu), peak RSS."""
    print("\n| family | ours encodes with | ours s (cpu) | gigatoken s (cpu) | bare s (cpu) | Megatron s (cpu) | "
          "Megatron fast s (cpu) | ours vs gigatoken | ours vs bare | ours vs Megatron | ours vs Megatron fast | "
          "peak RSS ours" + (f" 1x -> {scale}x |" if scale else " |"))
    print("|---" * 11 + "|")
    for r in rows:
        o = r["ours"]
        secs = lambda x: f"{x['seconds']:.2f} ({x['cpu']:.2f})" if x else "-"  # noqa: E731
        vs = lambda x: f"{x['seconds'] / o['seconds']:.2f}x; {x['cpu'] / o['cpu']:.2f}x" if x else "-"  # noqa: E731
        rss = f"{o['peak_rss_mb']:.0f} MB"
        if "big" in r:
            rss += f" -> {r['big']['peak_rss_mb']:.0f} MB ({r['big']['peak_rss_mb'] / o['peak_rss_mb']:.2f})"
        others = [r.get(k) for k in ("gigatoken", "bare", "Megatron", "Megatron fast")]
        print(f"| {r['family']} | {r['method']} | {secs(o)} | " + " | ".join(secs(x) for x in others) + " | "
              + " | ".join(vs(x) for x in others) + f" | {rss} |")
