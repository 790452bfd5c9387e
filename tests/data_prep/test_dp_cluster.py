"""Cluster-scale data prep: slices, hostfile over real ssh, Slurm scripts, merge, blend, plan."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.support.data_prep import REPO, read_all_docs, run_cli, tree_bytes, write_duplicated_corpus, write_jsonl

import data_prep.write.manifest as mf
from data_prep import io
from data_prep.pipeline import Settings, run
from data_prep.write.shards import ShardWriter

PY = sys.executable


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, texts):
    d = tmp_path_factory.mktemp("cluster_in")
    write_jsonl(d / "big.jsonl", [{"text": t} for t in texts[:30]])
    for i in range(4):
        write_jsonl(d / f"s{i}.jsonl", [{"text": t} for t in texts[30 + 2 * i: 32 + 2 * i]])
    return d


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus, sp_model):
    out = tmp_path_factory.mktemp("cluster_ref") / "out"
    run(Settings(inputs=[str(corpus)], output_dir=str(out), tokenizer=sp_model, shard_size=30_000, quiet=True))
    return tree_bytes(out)


def _targs(corpus, out, sp_model):
    return [str(corpus), "-o", str(out), "-t", sp_model, "--shard-size", "30000"]


def _shared_files(tree):
    """Everything but per-run logs: shards, stats, reject logs, plan and manifest."""
    return {k: v for k, v in tree.items() if not k.startswith("logs/")}


@pytest.mark.multiproc
def test_slices_in_any_order_then_merge_equal_one_local_run(tmp_path, corpus, sp_model, reference):
    out = tmp_path / "out"
    for i in (2, 0):
        r = run(Settings(inputs=[str(corpus)], output_dir=str(out), tokenizer=sp_model, shard_size=30_000,
                         slice_index=i, slice_count=3, quiet=True))
        assert r is None  # other slices still missing: no manifest yet
    r = run_cli("tokenize", *_targs(corpus, out, sp_model), "--merge-only", check=False)
    assert r.returncode == 1 and "not complete" in r.stderr and not (out / "manifest.json").exists()
    r = run(Settings(inputs=[str(corpus)], output_dir=str(out), tokenizer=sp_model, shard_size=30_000,
                     slice_index=1, slice_count=3, quiet=True))
    assert r is not None  # the last slice to finish writes the manifest
    got = tree_bytes(out)
    got.pop("failed_units.json", None)
    assert got == reference


@pytest.mark.multiproc
def test_slurm_scripts_chunk_the_array_and_run_for_real_as_array_tasks(tmp_path, corpus, sp_model, reference):
    from data_prep.executors.slurm import render

    paths = render(["in", "-o", "out", "-t", "tok"], 2500, str(tmp_path / "big"), PY, str(tmp_path),
                   max_array_size=1001)
    arrays = [p for p in paths if p.endswith(".sbatch") and "array_" in p]
    assert len(arrays) == 3
    texts = [open(p).read() for p in arrays]
    assert [t.split("--array=")[1].split()[0] for t in texts] == ["0-999", "0-999", "0-499"]
    assert ["SLURM_ARRAY_TASK_ID + 0 ", "SLURM_ARRAY_TASK_ID + 1000 ", "SLURM_ARRAY_TASK_ID + 2000 "] == [
        t.split("SLICE=$(( ")[1].split(")")[0] for t in texts]
    for p in paths:
        subprocess.run(["bash", "-n", p], check=True)
    assert "afterany" in open(paths[-1]).read()

    # a real run: each array task executed as Slurm would (SLURM_ARRAY_TASK_ID set), then finalize
    out = tmp_path / "out"
    r = run_cli("slurm", "--tasks", "3", "--scripts-dir", tmp_path / "s", "--dry-run", "--cpus-per-task", "1", "--",
                *_targs(corpus, out, sp_model))
    assert "#SBATCH --array=0-2" in r.stdout
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for task in (0, 2):
        subprocess.run(["bash", str(tmp_path / "s" / "array_0000.sbatch")], check=True, capture_output=True,
                       env=dict(env, SLURM_ARRAY_TASK_ID=str(task), SLURM_CPUS_PER_TASK="1"))
    # task 1 "failed": a rerun with --only-incomplete resubmits just that slice
    r = run_cli("slurm", "--tasks", "3", "--scripts-dir", tmp_path / "s2", "--dry-run", "--only-incomplete", "--",
                *_targs(corpus, out, sp_model))
    assert "#SBATCH --array=1\n" in r.stdout
    subprocess.run(["bash", str(tmp_path / "s2" / "array_0000.sbatch")], check=True, capture_output=True,
                   env=dict(env, SLURM_ARRAY_TASK_ID="1"))
    subprocess.run(["bash", str(tmp_path / "s2" / "finalize.sbatch")], check=True, capture_output=True, env=env)
    got = tree_bytes(out)
    assert got == reference


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A real sshd on loopback (temporary keys, free port), two host aliases on 127.0.0.1 and 127.0.0.2."""
    from tests.support.loopback_ssh import loopback_sshd, unavailable

    if unavailable():
        pytest.fail(f"cannot start a loopback sshd: {unavailable()}; run launch/install_system_deps.sh")
    d = tmp_path_factory.mktemp("dp_sshd")
    with loopback_sshd(str(d), {"prep1": "127.0.0.1", "prep2": "127.0.0.2"},
                       unreachable={"prepdead": "127.0.0.3"}) as config:
        yield Path(config)


@pytest.mark.ssh
def test_hostfile_executor_over_real_ssh(tmp_path, corpus, sp_model, reference, sshd):
    env = dict(os.environ, LAUNCH_SSH_CONFIG=str(sshd), LAUNCH_SSH_TIMEOUT="20", OMP_NUM_THREADS="1")
    out = tmp_path / "out"
    # one node unreachable: the other's units complete, the run fails naming the missing units
    (tmp_path / "hosts_bad").write_text("prep1 slots=1\nprepdead slots=1\n")
    r = subprocess.run(["bash", f"{REPO}/launch/prep.sh", "--hostfile", str(tmp_path / "hosts_bad"), "--log-dir",
                        str(tmp_path / "logs1"), "--", *_targs(corpus, out, sp_model)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 1 and "prepdead" in r.stderr and "not complete" in r.stderr
    assert not (out / "manifest.json").exists()
    done_before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.stats.json")}
    assert done_before, "the reachable node must have completed its units"
    # rerun on two good nodes (a different node count is fine): only the missing units are done
    (tmp_path / "hosts").write_text("# two loopback nodes\nprep1 slots=1\nprep2 slots=2\n")
    r = subprocess.run(["bash", f"{REPO}/launch/prep.sh", "--hostfile", str(tmp_path / "hosts"), "--log-dir",
                        str(tmp_path / "logs2"), "--", *_targs(corpus, out, sp_model)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert all((out / n).stat().st_mtime_ns == t for n, t in done_before.items())
    got = tree_bytes(out)
    got.pop("failed_units.json", None)
    assert got == reference
    assert sorted(os.listdir(tmp_path / "logs2")) == ["prep_0_prep1.log", "prep_1_prep2.log"]


@pytest.mark.ssh
def test_prep_sh_runs_curation_stage_by_stage_over_ssh_equal_local(tmp_path, sshd):
    inp, steps = write_duplicated_corpus(tmp_path / "in")
    cargs = [inp, "--steps", steps, "--shard-size", "20000"]
    run_cli("curate", *cargs, "-o", tmp_path / "ref", "-j", 1, "-q")
    out = tmp_path / "out"
    env = dict(os.environ, LAUNCH_SSH_CONFIG=str(sshd), LAUNCH_SSH_TIMEOUT="20", OMP_NUM_THREADS="1")

    def prep(hosts, logs):
        (tmp_path / "hosts").write_text(hosts)
        # run from the repository under test: `python -m` puts the working directory first on sys.path, so the
        # nodes import this tree (ssh passes no PYTHONPATH; the venv's editable install may point elsewhere)
        return subprocess.run(["bash", f"{REPO}/launch/prep.sh", "--hostfile", str(tmp_path / "hosts"), "--log-dir",
                               str(tmp_path / logs), "--", "curate", *cargs, "-o", str(out)], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=240)

    # a dead node fails the hash stage: no later stage starts anywhere, and the run says so
    r = prep("prep1 slots=1\nprepdead slots=1\n", "logs1")
    assert r.returncode == 1 and "prepdead" in r.stderr and "stage hash failed" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path / "logs1")) == ["prep_hash_0_prep1.log", "prep_hash_1_prepdead.log"]
    assert list((out / "dedup").glob("hash_*.json")) and not list((out / "dedup").glob("bucket_*.json"))
    r = prep("prep1 slots=1\nprep2 slots=2\n", "logs2")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "logs2")) == [f"prep_{s}_{i}_prep{i + 1}.log" for s in
                                                      ("buckets", "filter", "hash") for i in (0, 1)]
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")


def _tiny_shards(d, n, rng):
    stats, all_docs = [], []
    for i in range(n):
        name = f"shard_{i:06d}"
        w = ShardWriter(str(d / name), np.uint16, fsync=False)  # test fixtures: no need to reach the disk
        docs = [rng.integers(0, 1000, size=int(rng.integers(1, 30))).astype(np.uint16)
                for _ in range(int(rng.integers(1, 4)))]
        for x in docs:
            w.add_document([x])
        st = w.finalize()
        all_docs += [x.tolist() for x in docs]
        stats.append({"prefix": name, **st, "input_records": len(docs) + 1, "inputs": [{"path": f"f{i}"}],
                      "rejected": {"empty_text": 1}})
    tok = {"type": "sentencepiece", "path": "x", "vocab_size": 1000, "eod_id": 2, "bos_id": None, "pad_id": None,
           "sha256": "t"}
    m = mf.build_manifest(str(d), stats, tok, "uint16", {})
    io.atomic_write(str(d / "manifest.json"), mf.dumps(m))
    return all_docs


@pytest.mark.multiproc
def test_merge_1000_shards_streaming(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    want = _tiny_shards(src, 1000, np.random.default_rng(1))
    out = tmp_path / "merged"
    # VmHWM: this process's own peak (ru_maxrss would include the forking pytest's pages)
    code = ("import sys; from data_prep.cli import main; rc = main(sys.argv[1:]); "
            "print('MAXRSS', [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0]); "
            "sys.exit(rc)")
    r = subprocess.run([PY, "-c", code, "merge", str(src), "-o", str(out), "--target-size", "20000", "-q"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rss_mb = int(r.stdout.split("MAXRSS")[1]) / 1024
    assert rss_mb < 200, f"merge peak RSS {rss_mb:.0f} MB"
    m, docs = read_all_docs(out)
    assert docs == want
    assert 1 < len(m["shards"]) < 20 and all(s["bytes"] <= 20000 + 100 for s in m["shards"][:-1])
    assert m["totals"]["rejected"] == {"empty_text": 1000}
    assert m["totals"]["input_records"] == m["totals"]["documents"] + 1000
    from data_prep.write.verify import verify

    assert verify(str(out)) == []


@pytest.mark.unit
def test_blend_weights_epochs_and_prefix_limit(tmp_path):
    from data_prep.write.blend import build_blend, parse_sources

    a, b = tmp_path / "web", tmp_path / "code"
    for d, seed in ((a, 2), (b, 3)):
        d.mkdir()
        _tiny_shards(d, 3, np.random.default_rng(seed))
    ma, mb = mf.read_manifest(str(a)), mf.read_manifest(str(b))
    out = build_blend(parse_sources([f"web={a}:0.75", f"code={b}:0.25"]), token_budget=1000)
    weights = out["blend"][0::2]
    assert abs(sum(weights) - 1) < 1e-9
    assert abs(sum(weights[:3]) - 0.75) < 1e-9
    assert out["blend"][1] == str(a / ma["shards"][0]["prefix"])
    assert weights[0] / weights[1] == pytest.approx(ma["shards"][0]["tokens"] / ma["shards"][1]["tokens"])
    assert out["sources"][0]["epochs"] == pytest.approx(750 / ma["totals"]["tokens"])
    assert out["sources"][1]["epochs"] == pytest.approx(250 / mb["totals"]["tokens"])
    # past megatron-core's 32,767 prefixes: refused, with the merge command to run
    big = tmp_path / "big"
    big.mkdir()
    fake = dict(ma, shards=[dict(ma["shards"][0], prefix=f"p{i}") for i in range(33000)])
    (big / "manifest.json").write_text(json.dumps(fake))
    with pytest.raises(ValueError, match="32767.*data_prep merge"):
        build_blend(parse_sources([str(big)]))


@pytest.mark.multiproc
def test_plan_prints_tokens_shards_time_and_training_share(tmp_path, corpus, sp_model):
    r = run_cli("plan", "--corpus-size", "10P", "--sample", corpus / "big.jsonl", "-t", sp_model, "--sample-size",
                "200k", "--nodes", "1", "100", "--model-params", "130e9", "--gpus", "800")
    out = r.stdout
    assert "bytes/token" in out and "PB on disk" in out and "100 node(s)" in out
    assert "Chinchilla-optimal" in out and "% of this corpus" in out
    # the curation stages, measured on the same sample: throughput per core, kept fraction, node-hours
    for stage in ("dedup hash pass", "dedup bucket pass", "dedup cluster pass", "filter pass"):
        assert re.search(stage + r" +\d+\.\d+ MB/s per core +[\d,]+ core-hours", out), out
    kept = re.search(r"kept on the sample: ([\d.]+)% of documents", out)
    assert kept and 0 < float(kept.group(1)) <= 100
    assert re.search(r"100 node\(s\): curation [\d,.]+ h \([\d,]+ node-hours\) \+ tokenize", out)


@pytest.mark.multiproc
def test_plan_without_a_sample_or_tokenizer_leaves_nothing_behind(tmp_path):
    """Given neither, the plan builds a sample corpus and trains a tokenizer on it (~4 MB): gone when it ends."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    r = run_cli("plan", "--corpus-size", "1G", "--steps", "none", env_extra={"TMPDIR": str(scratch)})
    assert "bytes/token" in r.stdout
    assert list(scratch.iterdir()) == []


@pytest.mark.multiproc
def test_ray_executor_on_a_local_ray_cluster_equals_local(tmp_path, corpus, sp_model, reference):
    out = tmp_path / "out"
    m = run(Settings(inputs=[str(corpus)], output_dir=str(out), tokenizer=sp_model, shard_size=30_000, workers=2,
                     executor="ray", quiet=True))
    assert m is not None
    assert tree_bytes(out) == reference


@pytest.mark.multiproc
def test_curate_on_ray_equals_local(tmp_path, corpus, monkeypatch):
    """Filter + exact + MinHash dedup on a local Ray instance: the same files as one local worker. Its three passes
    (hash, buckets, filter) share one private Ray instance."""
    from data_prep.curate import CurateSettings
    from data_prep.curate import run as curate
    from data_prep.executors import ray as ray_executor

    starts = []
    start = ray_executor._start_private
    monkeypatch.setattr(ray_executor, "_start_private", lambda *a: (starts.append(a), start(*a))[1])

    quality = {"quality": {"min_words": 20, "min_stop_words": 0, "min_punctuation_line_fraction": None}}
    # Six exact copies, in another unit, of documents the quality rule keeps (found by a quality-only run): a copy of
    # a document the rule removes would be removed by the rule too, not counted as a duplicate.
    kept = _kept_texts(curate(CurateSettings(inputs=[str(corpus)], output_dir=str(tmp_path / "quality"),
                                             steps={"steps": [quality]}, shard_size=30_000, quiet=True)),
                       tmp_path / "quality")
    (tmp_path / "dups").mkdir()
    write_jsonl(tmp_path / "dups" / "copies.jsonl", [{"text": t} for t in list(dict.fromkeys(kept))[:6]])
    want = 6 + len(kept) - len(set(kept))  # and any repeat the corpus itself holds
    steps = {"steps": [quality, {"exact_dedup": {}}, {"minhash_dedup": {"threshold": 0.7}}], "buckets": 4}
    outs = {}
    for kind, workers in (("local", 1), ("ray", 2)):
        outs[kind] = tmp_path / kind
        m = curate(CurateSettings(inputs=[str(corpus), str(tmp_path / "dups")], output_dir=str(outs[kind]),
                                  steps=steps, workers=workers, executor=kind, shard_size=30_000, quiet=True))
        assert m["totals"]["removed"]["exact_dedup"]["duplicate"] == want, m["totals"]["removed"]
        texts = _kept_texts(m, outs[kind])
        assert len(texts) == len(set(texts)) and set(texts) <= set(kept)  # no copy survives; the rule still holds
    assert tree_bytes(outs["ray"]) == tree_bytes(outs["local"])
    assert len(starts) == 1  # one instance for the three passes, stopped at the end
    import ray  # imported by the runs above, under the private instance's environment

    assert not ray.is_initialized()


def _kept_texts(manifest, out):
    texts = []
    for entry in manifest["files"]:
        with open(out / entry["file"], "rb") as f:
            texts += [json.loads(line)["text"] for line in f]
    return texts


@pytest.mark.multiproc
def test_prep_sh_probes_inputs_before_any_node_starts(tmp_path, corpus, sp_model):
    """A text field the inputs lack is refused by launch/prep.sh (dry run and real run) before any node is contacted:
    the hostfile's hosts do not even resolve, so a started slice would fail differently."""
    (tmp_path / "hosts").write_text("no-such-node-a slots=1\nno-such-node-b slots=1\n")
    out = tmp_path / "out"
    for extra in (["--dry-run"], []):
        r = subprocess.run(["bash", f"{REPO}/launch/prep.sh", "--hostfile", str(tmp_path / "hosts"), "--log-dir",
                            str(tmp_path / "logs"), *extra, "--", *_targs(corpus, out, sp_model),
                            "--text-field", "content"], cwd=tmp_path, capture_output=True, text=True, timeout=180)
        assert r.returncode == 2, (extra, r.stdout, r.stderr)
        assert "nothing was started" in r.stderr and "--text-field" in r.stderr, r.stderr
        assert "no-such-node" not in r.stdout  # no per-node command printed, none run
        assert not (tmp_path / "logs").exists() and not out.exists()
