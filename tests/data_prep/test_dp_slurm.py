"""data_prep's Slurm job arrays (`python -m data_prep slurm`) submitted to a real Slurm (munged + slurmctld + slurmd
on this machine, tests/support/slurm.py): 4 array tasks, one made to fail, resubmitted with --only-incomplete, give
byte for byte the shards and manifest of one local run; curation as three chained arrays (hash, buckets, filter),
a failed hash task cancelling the later passes, resubmitted per pass, gives the bytes of one local curate run."""
import os
import re

import pytest
from tests.support.data_prep import REPO, run_cli, tree_bytes, write_duplicated_corpus, write_jsonl

from data_prep.pipeline import Settings, run

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(300)]

# Makes array task 2 die at interpreter start while FLAG exists: a task lost on a bad node, say. Slurm hands the
# submitting environment (PYTHONPATH included) to every task.
FAIL_TASK = """import os, sys
if os.environ.get("SLURM_ARRAY_TASK_ID") == "2" and os.path.exists({flag!r}):
    print("injected failure of array task 2", file=sys.stderr)
    os._exit(3)
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, texts):
    d = tmp_path_factory.mktemp("slurm_in")
    for i in range(6):  # 6 files = 6 units over 4 slices
        write_jsonl(d / f"s{i}.jsonl", [{"text": t} for t in texts[5 * i: 5 * i + 5]])
    return d


def _submit(slurm, scripts, targs, *extra, env):
    r = run_cli("slurm", "--tasks", 4, "--scripts-dir", scripts, "--cpus-per-task", 1, "--time", "10:00", *extra,
                "--", *targs, env_extra=env)
    array = re.search(r"submitted array jobs: (\d+)", r.stdout)
    final = re.search(r"Submitted batch job (\d+)", r.stdout)
    assert array and final, r.stdout + r.stderr
    return array[1], final[1]


def _failing_task_env(slurm, tmp_path, flag_name: str, template: str):
    """The jobs' environment with a sitecustomize (from ``template``) that fails a chosen task while ``flag`` exists."""
    inject = tmp_path / "inject"
    inject.mkdir()
    flag = tmp_path / flag_name
    flag.touch()
    (inject / "sitecustomize.py").write_text(template.format(flag=str(flag)))
    return flag, {"SLURM_CONF": slurm.env["SLURM_CONF"],
                  "PYTHONPATH": os.pathsep.join([str(inject), REPO, os.environ.get("PYTHONPATH", "")])}


def test_array_on_real_slurm_failed_task_resubmitted_equals_local_run(slurm, corpus, sp_model, tmp_path):
    ref = tmp_path / "ref"
    run(Settings(inputs=[str(corpus)], output_dir=str(ref), tokenizer=sp_model, shard_size=30_000, quiet=True))
    out = tmp_path / "out"
    targs = [str(corpus), "-o", str(out), "-t", sp_model, "--shard-size", "30000"]
    flag, env = _failing_task_env(slurm, tmp_path, "fail_task_2", FAIL_TASK)

    array, final = _submit(slurm, tmp_path / "s1", targs, env=env)
    assert "#SBATCH --array=0-3\n" in (tmp_path / "s1" / "array_0000.sbatch").read_text()
    slurm.wait_job(array, timeout=180)
    tasks = {j["ArrayTaskId"]: j for j in slurm.jobs(array)}
    assert {t: j["JobState"] for t, j in tasks.items()} == {"0": "COMPLETED", "1": "COMPLETED", "2": "FAILED",
                                                            "3": "COMPLETED"}
    assert tasks["2"]["ExitCode"] == "3:0"
    log2 = (tmp_path / "s1" / "logs" / f"prep_{array}_2.out").read_text()
    assert "injected failure of array task 2" in log2
    fin = slurm.wait_job(final, timeout=60)  # ran after every task (afterany) and refused the incomplete output
    assert fin["JobState"] == "FAILED" and not (out / "manifest.json").exists()

    flag.unlink()  # the node is fixed
    array, final = _submit(slurm, tmp_path / "s2", targs, "--only-incomplete", env=env)
    assert "#SBATCH --array=2\n" in (tmp_path / "s2" / "array_0000.sbatch").read_text()  # only what failed
    assert slurm.wait_job(array, timeout=120)["JobState"] == "COMPLETED"
    assert slurm.wait_job(final, timeout=60)["JobState"] == "COMPLETED"
    got = tree_bytes(out)
    got.pop("failed_units.json", None)  # the first finalize's report of the unit that was missing then
    assert got == tree_bytes(ref)


# Makes task 1 of the hash array die while FLAG exists (SLURM_JOB_NAME is the array's --job-name).
FAIL_HASH_TASK = """import os, sys
if os.environ.get("SLURM_JOB_NAME") == "data_prep_hash" and os.environ.get("SLURM_ARRAY_TASK_ID") == "1" \\
        and os.path.exists({flag!r}):
    print("injected failure of hash task 1", file=sys.stderr)
    os._exit(3)
"""
PASSES = ("hash", "buckets", "filter")


def _submit_curate(slurm, scripts, cargs, *extra, env):
    r = run_cli("slurm", "--tasks", 2, "--scripts-dir", scripts, "--cpus-per-task", 1, "--time", "10:00", *extra,
                "--", "curate", *cargs, env_extra=env)
    ids = {p: re.search(rf"submitted {p} array jobs: (\d+)", r.stdout) for p in PASSES}
    final = re.search(r"Submitted batch job (\d+)", r.stdout)
    assert all(ids.values()) and final, r.stdout + r.stderr
    return {p: m[1] for p, m in ids.items()}, final[1]


def test_curate_as_chained_arrays_on_real_slurm_equals_local_run(slurm, tmp_path):
    inp, steps = write_duplicated_corpus(tmp_path / "in")
    cargs = [inp, "--steps", steps, "--shard-size", "20000"]
    run_cli("curate", *cargs, "-o", tmp_path / "ref", "-j", 1, "-q")
    out = tmp_path / "out"
    flag, env = _failing_task_env(slurm, tmp_path, "fail_hash_1", FAIL_HASH_TASK)

    ids, final = _submit_curate(slurm, tmp_path / "s1", [*cargs, "-o", out], env=env)
    slurm.wait_job(ids["hash"], timeout=180)
    assert {j["ArrayTaskId"]: j["JobState"] for j in slurm.jobs(ids["hash"])} == {"0": "COMPLETED", "1": "FAILED"}
    # afterok can never be met: the later passes are cancelled (not left pending), finalize runs and refuses
    assert slurm.wait_job(ids["buckets"], timeout=60)["JobState"] == "CANCELLED"
    assert slurm.wait_job(ids["filter"], timeout=60)["JobState"] == "CANCELLED"
    assert slurm.wait_job(final, timeout=60)["JobState"] == "FAILED"
    assert "no hash pass yet" in (tmp_path / "s1" / "logs" / f"finalize_{final}.out").read_text()
    assert not list((out / "dedup").glob("bucket_*.json")) and not (out / "curation.json").exists()

    flag.unlink()  # the node is fixed: only the failed hash slice is resubmitted, then every bucket and filter task
    ids, final = _submit_curate(slurm, tmp_path / "s2", [*cargs, "-o", out], "--only-incomplete", env=env)
    assert "#SBATCH --array=1\n" in (tmp_path / "s2" / "hash_0000.sbatch").read_text()
    assert "#SBATCH --array=0-1\n" in (tmp_path / "s2" / "buckets_0000.sbatch").read_text()
    tasks = {}
    for p in PASSES:
        slurm.wait_job(ids[p], timeout=180)
        tasks[p] = slurm.jobs(ids[p])
        assert {j["JobState"] for j in tasks[p]} == {"COMPLETED"}, (p, tasks[p])
    assert len(tasks["buckets"]) == len(tasks["filter"]) == 2
    # each pass started after every task of the one before had ended (the afterok chain)
    for before, after in zip(PASSES, PASSES[1:]):
        assert min(j["StartTime"] for j in tasks[after]) >= max(j["EndTime"] for j in tasks[before])
    assert slurm.wait_job(final, timeout=60)["JobState"] == "COMPLETED"
    assert tree_bytes(out) == tree_bytes(tmp_path / "ref")
