"""`launch/prep.sh` (python -m launch prep): cluster data prep over a DeepSpeed-style hostfile. Node i of H runs
    python -m data_prep tokenize ARGS --slice i/H -j SLOTS        (or: curate ARGS, after "-- curate")
over ssh (all nodes at once; the repo, its venv and the output directory must be on a shared file system), then this
machine merges the per-unit stats into manifest.json (--merge-only) and lists any failed unit.
With curation steps (curate, tokenize --steps) the dedup passes are global: each stage (hash, buckets, filter) runs
on every node with --stage, and the next starts only when all nodes finished it; a failed stage ends the run.
Rerunning the same command redoes only what is missing. ssh honours LAUNCH_SSH_CONFIG like train.sh. Ctrl-C, kill,
a closed terminal and a SIGKILL of the launcher (launch/guard.py) stop the slices on every node.

    launch/prep.sh --hostfile FILE [--log-dir DIR] [--dry-run] -- [tokenize|curate] INPUTS... -o OUT [options]

On Slurm, no hostfile: one array task per slice, Slurm picks the nodes (`python -m data_prep slurm`, which writes the
array scripts, chains the curation passes and a finalize job that writes the manifest; --only-incomplete resubmits
the slices that failed):
    launch/prep.sh --backend slurm --tasks N [--partition P] [--account A] [--time T] [--qos Q]
                   [--cpus-per-task C] [--scripts-dir DIR] [--only-incomplete] [--dry-run] -- [tokenize|curate] ...

    --backend NAME   ssh (default: the hostfile's nodes) | slurm (array tasks; no hostfile)
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from launch.common import REPO_DIR, Interrupted, LaunchError, python, say
from launch.guard import Guard
from launch.hostfile import HostfileError, parse_hostfile
from launch.ssh import Ssh
from launch.stop import grace_of, stop_hosts

CURATION_STAGES = ("hash", "buckets", "filter")


# Passed on to `python -m data_prep slurm` as they are (it checks them: every value sbatch would take, exit 2).
SLURM_VALUED = ("--tasks", "--partition", "--account", "--time", "--qos", "--cpus-per-task", "--scripts-dir",
                "--max-array-size", "--max-concurrent")


def parse(argv: list[str]) -> dict:
    o = {"hostfile": os.environ.get("LAUNCH_HOSTFILE", ""), "log_dir": "", "dry_run": False, "args": [],
         "backend": "ssh", "slurm": []}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            o["args"] = argv[i + 1:]
            break
        if a in ("-h", "--help"):
            print(__doc__)
            raise SystemExit(0)
        if a in ("--hostfile", "--log-dir", "--backend") and i + 1 < len(argv):
            o[a[2:].replace("-", "_")] = argv[i + 1]
            i += 2
            continue
        if a in SLURM_VALUED and i + 1 < len(argv):
            o["slurm"] += [a, argv[i + 1]]
            i += 2
            continue
        if a == "--only-incomplete":
            o["slurm"].append(a)
        elif a == "--dry-run":
            o["dry_run"] = True
        else:
            raise LaunchError(f"unknown option {a} (tokenize arguments go after --)", 2)
        i += 1
    if o["backend"] not in ("ssh", "slurm"):
        raise LaunchError(f"--backend '{o['backend']}': use ssh (the hostfile's nodes, the default) or slurm (array "
                          "tasks; Slurm picks the nodes)", 2)
    if o["backend"] == "slurm" and o["hostfile"] and "--hostfile" in argv:
        raise LaunchError("--backend slurm takes no hostfile: Slurm picks the nodes (give --tasks N)", 2)
    if o["slurm"] and o["backend"] != "slurm":
        raise LaunchError(f"{o['slurm'][0]} is for --backend slurm (array tasks): add it, or drop the option", 2)
    return o


def prep_slurm(o: dict) -> int:
    """`python -m data_prep slurm`: the array scripts (and their submission unless --dry-run)."""
    if "--tasks" not in o["slurm"]:
        raise LaunchError("--backend slurm needs --tasks N: the number of slices, one array task each", 2)
    if not o["args"]:
        raise LaunchError("no tokenize (or curate) arguments after --", 2)
    argv = [python(), "-m", "data_prep", "slurm", *o["slurm"], *(["--dry-run"] if o["dry_run"] else []), "--",
            *o["args"]]
    return subprocess.call(argv)


def command_for(cmd: str, args: list[str], prep_id: str, i: int, h: int, slots: int, stage: str) -> str:
    """Slice i of h on one node. Relative paths in ARGS mean the same on every node: each runs in this directory
    (shared file system). LAUNCH_RUN_ID marks every process of this prep, so that a stop finds them."""
    return (f"cd {shlex.quote(os.getcwd())} && OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "
            f"LAUNCH_RUN_ID={shlex.quote(prep_id)} {shlex.quote(python())} -m data_prep {cmd} "
            + "".join(shlex.quote(a) + " " for a in args)
            + f"--slice {i}/{h} " + (f"--stage {stage} " if stage else "") + f"-j {slots} -q")


def run_stage(ssh: Ssh, nodes, log_dir: Path, cmd_of, stage: str) -> bool:
    """Every node runs its slice; False if any failed (each named, with its log's tail)."""
    h = len(nodes)
    if stage:
        say(f"stage {stage} on {h} node(s)")
    procs = []
    for i, n in enumerate(nodes):
        log = log_dir / f"prep_{stage + '_' if stage else ''}{i}_{n.host}.log"
        with open(log, "wb") as f:
            procs.append((i, n.host, log, subprocess.Popen(ssh.argv(n.host, cmd_of(i, n.slots, stage)), stdout=f,
                                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)))
    ok = True
    for i, host, log, p in procs:
        if p.wait() != 0:
            say(f"node {host} (slice {i}/{h}{', stage ' + stage if stage else ''}) failed: see {log}")
            sys.stderr.write("".join(log.read_text(errors="replace").splitlines(True)[-5:]))
            ok = False
    return ok


def prep(argv: list[str]) -> int:
    o = parse(argv)
    if o["backend"] == "slurm":
        return prep_slurm(o)
    if not o["hostfile"]:
        raise LaunchError("no hostfile: pass --hostfile FILE (lines 'host slots=N')", 2)
    args, cmd = o["args"], "tokenize"
    if args[:1] and args[0] in ("tokenize", "curate"):
        cmd, args = args[0], args[1:]
    if not args:
        raise LaunchError(f"no {cmd} arguments after -- (INPUTS... -o OUT -t TOKENIZER, or curate INPUTS... -o OUT "
                          "--steps FILE)", 2)
    # The curation passes are global (every unit's hashes before any bucket, every bucket before any filter).
    curating = cmd == "curate" or any(a == "--steps" or a.startswith("--steps=") for a in args)
    stages = CURATION_STAGES if curating else ("",)
    try:
        nodes = parse_hostfile(o["hostfile"])
    except HostfileError as e:
        raise LaunchError(f"bad hostfile {o['hostfile']}:\n{e}", 2) from None
    prep_id = f"prep-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"

    def cmd_of(i, slots, stage):
        return command_for(cmd, args, prep_id, i, len(nodes), slots, stage)

    probe(cmd, args)
    if o["dry_run"]:
        for stage in stages:
            if stage:
                print(f"# stage {stage}: on every node, then wait for all")
            for i, n in enumerate(nodes):
                print(f"{n.host}: {cmd_of(i, n.slots, stage)}")
        print(f"local: {python()} -m data_prep {cmd} {''.join(shlex.quote(a) + ' ' for a in args)}--merge-only")
        return 0
    return run(o, cmd, args, nodes, stages, prep_id, cmd_of)


def probe(cmd: str, args: list[str]) -> None:
    """The inputs and the output probed once from here before any node starts (or a dry run prints): a bucket that
    cannot be read or written, or a text field the inputs lack, must not cost every node a failed slice."""
    p = subprocess.run([python(), "-m", "data_prep", "probe", "--", cmd, *args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise LaunchError(f"data prep inputs/output probe failed, nothing was started:\n{p.stderr.strip()}", 2)


def run(o: dict, cmd: str, args: list[str], nodes, stages, prep_id: str, cmd_of) -> int:
    ssh = Ssh()
    log_dir = Path(o["log_dir"] or REPO_DIR / "runs" / "prep" / time.strftime("%Y%m%d-%H%M%S"))
    log_dir.mkdir(parents=True, exist_ok=True)
    hosts = [n.host for n in nodes]
    say(f"data prep on {len(nodes)} node(s); logs in {log_dir}")
    grace = grace_of(None)
    # Left running, a slice would go on writing while a rerun deletes its .tmp files.
    guard = Guard(["--on", ",".join(hosts), "--grace", f"{grace:g}", prep_id], os.devnull, f"data prep {prep_id}")
    try:
        failed = False
        for stage in stages:
            if not run_stage(ssh, nodes, log_dir, cmd_of, stage):
                failed = True
                if stage:  # a later stage needs this one complete on every node (what finished is kept)
                    say(f"stage {stage} failed: the later stages were not started")
                    break
    except Interrupted:
        say("interrupted: stopping data prep on all nodes")
        stop_hosts(ssh, hosts, prep_id, grace)
        return 130
    finally:
        guard.release()
    # One global manifest from the per-unit stats; lists the units still missing (and why) if any.
    if subprocess.run([python(), "-m", "data_prep", cmd, *args, "--merge-only", "-q"]).returncode != 0:
        say("some units are not complete; rerun the same command to redo only those")
        return 1
    if failed:
        return 1
    say(f"done: {'curation.json' if cmd == 'curate' else 'manifest.json'} written")
    return 0
