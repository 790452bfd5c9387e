"""Launcher mistakes stopped before anything starts, one line naming the fix (issue 42 item 3): counts out of range
(`--num-nodes 0` and `--num-gpus 0` used to mean "all"), paths of the wrong kind (a hostfile that is a directory: a
traceback; a recipe directory reported as an unknown preset; a log dir that is a file), and recipe paths of the
wrong kind that every rank would trip over after start-up (checkpoint.dir, logging.dir or data.cache_dir naming a
file) or the first evaluation hours in (evaluation.include_path, evaluation.text)."""
import pytest

from tests.support.launch import DATA, REPO

pytestmark = pytest.mark.unit

TINY = REPO / "configs" / "runs" / "tiny-cpu.yaml"
LOCAL = ["--backend", "local", "--num-gpus", "2"]


def refused(launch_here, tmp_path, *args, code=2) -> str:
    logs = tmp_path / "logs"
    cut = args.index("--") if "--" in args else len(args)
    r = launch_here("train.sh", *args[:cut], "--dry-run", "--log-dir", logs, *args[cut:])
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and not logs.exists()
    return r.stderr


def test_counts_of_zero_are_refused_not_read_as_all(tmp_path, launch_here):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=2\nnode2 slots=2\n")
    err = refused(launch_here, tmp_path, TINY, "--hostfile", hosts, "--backend", "torchrun-ssh", "--num-nodes", 0,
                  "--", DATA)
    assert err == "[launch] error: --num-nodes 0: give at least 1 (or leave --num-nodes out to use every selected " \
                  "host)\n"
    err = refused(launch_here, tmp_path, TINY, "--backend", "local", "--num-gpus", 0, "--", DATA)
    assert err == "[launch] error: --num-gpus 0: give at least 1 (or leave --num-gpus out to use every selected " \
                  "slot)\n"


def test_launcher_paths_of_the_wrong_kind(tmp_path, launch_here):
    err = refused(launch_here, tmp_path, TINY, "--hostfile", tmp_path, "--backend", "torchrun-ssh", "--", DATA)
    assert f"{tmp_path} is a directory, not a hostfile: pass --hostfile FILE, a file with lines like 'node1 " \
           "slots=8'" in err
    err = refused(launch_here, tmp_path, REPO / "configs" / "runs", *LOCAL, "--", DATA)
    assert err.startswith(f"[launch] error: recipe error: recipe '{REPO / 'configs' / 'runs'}' is a directory")
    assert "give a recipe file, e.g. " in err and "demo-cpu.yaml" in err
    afile = tmp_path / "afile"
    afile.write_text("")
    r = launch_here("train.sh", TINY, *LOCAL, "--log-dir", afile, "--", DATA)
    assert r.returncode == 2
    assert r.stderr == f"[launch] error: --log-dir {afile} is a file; give a directory for the run's logs (created " \
                       "when missing)\n"


@pytest.mark.parametrize("override, said", [
    ("checkpoint.dir={f}", "checkpoint.dir = {f} is a file, not a directory; give checkpoint.dir a directory (it is "
                           "created when missing), or move the file away"),
    ("logging.dir={f}", "logging.dir = {f} is a file, not a directory"),
    ("data.cache_dir={f}", "data.cache_dir = {f} is a file, not a directory"),
    ("evaluation.include_path={f}", "evaluation.include_path = {f} is a file; give the directory holding your "
                                    "lm-eval task YAMLs, or remove evaluation.include_path"),
    ("evaluation.text={f}.missing", "evaluation.text = {f}.missing does not exist; give a .jsonl or .txt file"),
], ids=["checkpoint.dir", "logging.dir", "data.cache_dir", "include_path", "eval-text"])
def test_recipe_paths_of_the_wrong_kind_are_refused_before_any_rank(override, said, tmp_path, launch_here):
    f = tmp_path / "afile"
    f.write_text("")
    extra = ["evaluation.interval=2"] if override.startswith("evaluation") else []
    err = refused(launch_here, tmp_path, TINY, *LOCAL, "--", DATA, override.format(f=f), *extra)
    assert err.startswith("[launch] error: recipe 'tiny-cpu' cannot start:\n  - " + said.format(f=f)), err


def test_a_relaunch_with_nothing_left_to_train_says_so_in_the_plan(tmp_path, launch_here):
    """A documented continuation once relaunched a run already at its last step and trained nothing, silently."""
    from tests.support.checkpoints import recorded_tag

    ck = tmp_path / "ck"
    recorded_tag(ck, str(TINY), world=2, step=6)  # tiny-cpu: training.train_steps=6
    r = launch_here("train.sh", TINY, *LOCAL, "--dry-run", "--", DATA, f"checkpoint.dir={ck}")
    assert r.returncode == 0, r.stderr
    note = (f"checkpoint: {ck} holds global_step6, the recipe's last step (6): this launch trains nothing; to "
            "continue, raise the length (e.g. -- training.train_steps=12)")
    assert note in r.stdout + r.stderr
    r = launch_here("train.sh", TINY, *LOCAL, "--dry-run", "--", DATA, f"checkpoint.dir={ck}",
                    "training.train_steps=12")
    assert r.returncode == 0 and "trains nothing" not in r.stdout + r.stderr
