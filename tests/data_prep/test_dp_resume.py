"""Determinism across worker counts, resume, and SIGKILL-at-any-moment + rerun = byte-identical output."""

import os
import signal
import subprocess
import sys
import time

import pytest
from tests.support.data_prep import REPO, read_all_docs, run_cli, tree_bytes, write_jsonl

from data_prep.pipeline import Settings, run

pytestmark = pytest.mark.multiproc


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, texts):
    d = tmp_path_factory.mktemp("resume_in")
    # one big file (split into byte ranges) + several small ones (packed) + a bad record
    write_jsonl(d / "big.jsonl", [{"text": t} for t in texts[:40]])
    for i in range(5):
        write_jsonl(d / f"small_{i}.jsonl", [{"text": t} for t in texts[40 + 3 * i: 43 + 3 * i]])
    with open(d / "small_0.jsonl", "ab") as f:
        f.write(b"{broken\n")
    return d


def _settings(inputs, out, tok, workers):
    return Settings(inputs=[str(inputs)], output_dir=str(out), tokenizer=tok, workers=workers, shard_size=40_000,
                    quiet=True)


def test_same_bytes_whatever_the_worker_count(tmp_path, inputs, sp_model):
    m1 = run(_settings(inputs, tmp_path / "w1", sp_model, 1))
    run(_settings(inputs, tmp_path / "w2", sp_model, 2))
    run(_settings(inputs, tmp_path / "w3", sp_model, 3))
    assert len(m1["shards"]) >= 5, "the plan should have several units, including byte ranges of big.jsonl"
    assert sum(1 for s in m1["shards"] if s["inputs"][0]["path"].endswith("big.jsonl")) >= 3
    t1 = tree_bytes(tmp_path / "w1")
    assert t1 == tree_bytes(tmp_path / "w2") == tree_bytes(tmp_path / "w3")
    # the byte ranges of big.jsonl give exactly the documents of the whole file, in order
    import sentencepiece as spm
    import orjson

    sp = spm.SentencePieceProcessor(model_file=sp_model)
    lines = [orjson.loads(x)["text"] for x in open(inputs / "big.jsonl", "rb")]
    _, docs = read_all_docs(tmp_path / "w1")
    assert docs[: len(lines)] == [ids + [sp.eos_id()] for ids in sp.encode(lines)]


def test_resume_skips_complete_units_and_redoes_damaged_ones(tmp_path, inputs, sp_model):
    out = tmp_path / "out"
    run(_settings(inputs, out, sp_model, 2))
    ref = tree_bytes(out)
    mtimes = {p: os.stat(out / p).st_mtime_ns for p in ref if p.endswith((".bin", ".idx"))}
    # damage one unit's shard (truncate) and delete another's completion marker
    victim = sorted(p for p in mtimes if p.endswith(".bin"))[1]
    with open(out / victim, "r+b") as f:
        f.truncate(10)
    os.remove(out / "shard_000003.stats.json")
    run(_settings(inputs, out, sp_model, 2))
    assert tree_bytes(out) == ref
    redone = {p for p in mtimes if os.stat(out / p).st_mtime_ns != mtimes[p]}
    assert redone == {victim, victim.replace(".bin", ".idx"), "shard_000003.bin", "shard_000003.idx"}


def _run_until(args, env, out, kill_after=None):
    """Start the CLI; return (seconds until its first unit completed, total seconds, killed?). With kill_after, the
    whole process group is SIGKILLed that many seconds after the first unit completed (mid-shard, mid-rename,
    mid-stats or mid-manifest, depending on the moment)."""
    t0 = time.time()
    p = subprocess.Popen(args, cwd=REPO, env=env, start_new_session=True)
    first = None
    while p.poll() is None:
        if first is None and out.exists() and any(out.glob("*.stats.json")):
            first = time.time() - t0
        if first is not None and kill_after is not None and time.time() - t0 >= first + kill_after:
            os.killpg(p.pid, signal.SIGKILL)  # the driver and its workers, mid-run
            p.wait()
            return first, time.time() - t0, True
        time.sleep(0.002)
    assert p.returncode == 0
    return first if first is not None else time.time() - t0, time.time() - t0, False


def test_sigkill_at_any_moment_then_rerun_is_byte_identical(tmp_path, inputs, sp_model):
    ref_dir = tmp_path / "ref"
    run(Settings(inputs=[str(inputs)], output_dir=str(ref_dir), tokenizer=sp_model, shard_size=1_000, quiet=True))
    ref = tree_bytes(ref_dir)
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def cli(out, workers=1):
        return [sys.executable, "-m", "data_prep", "tokenize", str(inputs), "-o", str(out), "-t", sp_model,
                "--shard-size", "1000", "-j", str(workers), "-q"]

    # Time one uninterrupted run, then kill fresh runs at spread-out moments of their unit work, so the kills land
    # inside the work whatever this machine's speed.
    first, total, _ = _run_until(cli(tmp_path / "timing"), env, tmp_path / "timing")
    work = max(total - first, 0.01)
    kills = 0
    for i, frac in enumerate((0.1, 0.3, 0.5, 0.7, 0.9)):
        # A busy machine can make the timed run slower than this one: a run that finished before its moment is
        # tried again earlier (half the delay, and timed on that run's own work), so the kills still land inside it.
        for attempt in range(3):
            out = tmp_path / f"killed{i}-{attempt}"
            first_i, total_i, killed = _run_until(cli(out), env, out, kill_after=frac * work / 2 ** attempt)
            if not killed:
                work = min(work, max(total_i - first_i, 0.01))
            if (out / "manifest.json").exists() and killed:  # killed after the manifest: it must be the final one
                assert (out / "manifest.json").read_bytes() == ref["manifest.json"]
            run_cli("tokenize", inputs, "-o", out, "-t", sp_model, "--shard-size", "1000", "-j", "2", "-q")
            assert tree_bytes(out) == ref, f"rerun after a SIGKILL at {frac:.0%} of the work differs from a clean run"
            if killed:
                kills += 1
                break
    assert kills >= 4, f"only {kills} of 5 runs were still working when killed"


def test_a_temporary_file_whose_pid_was_reused_is_stale(tmp_path):
    """A killed writer's temporary file names its pid; under heavy process churn the pid may be taken by a new
    process before the rerun looks (seen in a full-suite run: a killed curation's .tmp stayed beside the rerun's
    output). A process that started after the file was last written cannot be its writer: the file goes."""
    import os
    import socket

    from data_prep import io

    name = f"part.npy.tmp.{socket.gethostname()}.{os.getpid()}"  # our pid: alive
    old, fresh = tmp_path / "old", tmp_path / "fresh"
    for d in (old, fresh):
        d.mkdir()
        (d / name).write_bytes(b"x")
    os.utime(old / name, (1, 1))  # written long before this process started: its writer had this pid before us
    io.remove_stale_tmp(str(old))
    io.remove_stale_tmp(str(fresh))
    assert not (old / name).exists() and (fresh / name).exists()


def test_a_temporary_file_of_a_killed_writer_not_yet_reaped_is_stale(tmp_path):
    """A SIGKILLed run's workers stay zombies until init reaps them; a rerun started at once found their pids alive
    and kept a killed worker's .tmp beside its output (seen in a fresh-clone suite run). A zombie writes nothing: the
    file goes, while a live writer's stays."""
    import socket

    from data_prep import io

    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        names = {p: f"keys_000014.npy.tmp.{socket.gethostname()}.{p.pid}" for p in (zombie, live)}
        for n in names.values():
            (tmp_path / n).write_bytes(b"x")  # written after both started, by them as far as the names say
        zombie.kill()
        deadline = time.time() + 10
        while open(f"/proc/{zombie.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":  # killed, not reaped
            assert time.time() < deadline
            time.sleep(0.01)
        io.remove_stale_tmp(str(tmp_path))
        assert not (tmp_path / names[zombie]).exists() and (tmp_path / names[live]).exists()
    finally:
        for p in (zombie, live):
            p.kill()
            p.wait()
