"""data_prep's Slurm job arrays (`python -m data_prep slurm`) submitted to a real Slurm (munged + slurmctld + slurmd
on this machine, tests/support/slurm.py): 4 array tasks, one made to fail, resubmitted with --only-incomplete, give
byte for byte the shards and manifest of one local run."""
import os
import re

import pytest
from tests.support.data_prep import REPO, run_cli, tree_bytes, write_jsonl

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


def test_array_on_real_slurm_failed_task_resubmitted_equals_local_run(slurm, corpus, sp_model, tmp_path):
    ref = tmp_path / "ref"
    run(Settings(inputs=[str(corpus)], output_dir=str(ref), tokenizer=sp_model, shard_size=30_000, quiet=True))
    out = tmp_path / "out"
    targs = [str(corpus), "-o", str(out), "-t", sp_model, "--shard-size", "30000"]
    inject = tmp_path / "inject"
    inject.mkdir()
    flag = tmp_path / "fail_task_2"
    flag.touch()
    (inject / "sitecustomize.py").write_text(FAIL_TASK.format(flag=str(flag)))
    env = {"SLURM_CONF": slurm.env["SLURM_CONF"],
           "PYTHONPATH": os.pathsep.join([str(inject), REPO, os.environ.get("PYTHONPATH", "")])}

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
